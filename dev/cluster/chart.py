"""The chart's RBAC rules, rendered by a real Helm engine, for identities the harness makes.

``rbac_for(sa)`` gives a ServiceAccount, the chart's ClusterRole as rendered, and a binding of
that role to the ServiceAccount: a service run as a host process then has exactly the rights the
DaemonSet's pod would have, so a missing or excess permission shows in the tests.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parents[2] / "charts" / "dranet"


@functools.cache
def rendered(namespace: str = "kube-system") -> tuple[dict[str, Any], ...]:
    import helm_python as helm  # loads the Helm engine (a shared library): only when asked

    with helm.Chart.load(str(CHART)) as chart:
        manifests = chart.render({}, name="dranet", namespace=namespace)
    return tuple(
        d for f, text in manifests.items() if f.endswith(".yaml") for d in yaml.safe_load_all(text) if d
    )


def cluster_role(namespace: str = "kube-system") -> dict[str, Any]:
    (role,) = [d for d in rendered(namespace) if d["kind"] == "ClusterRole"]
    return role


def rbac_for(sa: str, namespace: str = "kube-system") -> str:
    # The chart's rules under the identity's own name: a helm install of the chart on the same
    # cluster owns the ClusterRole "dranet" and must find none it did not make.
    role = copy.deepcopy(cluster_role(namespace))
    role["metadata"] = {"name": sa, "labels": dict(role["metadata"].get("labels", {}))}
    docs = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa, "namespace": namespace}},
        role,
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": sa},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": role["metadata"]["name"],
            },
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": namespace}],
        },
    ]
    return yaml.safe_dump_all(docs)
