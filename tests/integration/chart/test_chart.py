"""The Helm chart, rendered by a real Helm engine (Helm v4 SDK) and checked
against the Kubernetes 1.34 OpenAPI schemas (strict: unknown fields fail)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

CHART = Path(__file__).resolve().parents[3] / "charts" / "dranet"
K8S_VERSION = "1.34.0"


def render(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    with helm.Chart.load(str(CHART)) as chart:
        manifests = chart.render(values or {}, name="dranet", namespace="kube-system")
    docs = [d for f, text in manifests.items() if f.endswith(".yaml") for d in yaml.safe_load_all(text) if d]
    assert docs, "the chart rendered nothing"
    return docs


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def test_lint_has_no_errors() -> None:
    result = helm.lint(str(CHART))
    assert result["errors"] == [], result


@pytest.mark.parametrize(
    "values",
    [
        {},
        {
            "kubeletRootDir": "/data/kubelet",
            "inventory": {"filter": 'device.attributes["dra.net"].rdma == true'},
        },
        {"serviceAccount": {"create": False, "name": "existing"}, "deviceClass": {"create": False}},
    ],
    ids=["defaults", "custom", "no-sa-no-class"],
)
def test_every_object_validates_against_the_real_schema(values: dict[str, Any]) -> None:
    for doc in render(values):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_four_services_each_with_its_own_settings() -> None:
    values = {
        "image": {"repository": "example/dranet", "tag": "1.2.3"},
        "attach": {"image": {"tag": "1.2.4"}, "logLevel": "DEBUG"},
        "store": {"resources": {"limits": {"memory": "1Gi"}}},
    }
    (ds,) = by_kind(render(values), "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in spec["initContainers"] + spec["containers"]}
    assert list(containers) == ["store", "inventory", "prepare", "attach"]
    # The store is a native sidecar: started before the others, stopped after them.
    assert spec["initContainers"][0]["restartPolicy"] == "Always"
    for name, c in containers.items():
        assert c["command"] == ["python", "-m", f"services.{name}"]
        assert "--run-dir=/var/run/dranet" in c["args"]
        assert c["securityContext"] and c["resources"]
    assert containers["store"]["image"] == "example/dranet:1.2.3"
    assert containers["attach"]["image"] == "example/dranet:1.2.4"
    assert "--log-level=DEBUG" in containers["attach"]["args"]
    assert "--log-level=INFO" in containers["prepare"]["args"]
    assert containers["store"]["resources"]["limits"]["memory"] == "1Gi"
    # Only attach is privileged; the store needs no capabilities at all.
    assert containers["attach"]["securityContext"].get("privileged") is True
    assert containers["store"]["securityContext"]["capabilities"]["drop"] == ["ALL"]
    # Least privilege: no token unless mounted; only inventory and prepare mount one.
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    with_token = [
        n for n, c in containers.items() if any(m["name"] == "kube-api-access" for m in c["volumeMounts"])
    ]
    assert with_token == ["inventory", "prepare"]
    for name, c in containers.items():
        assert c["readinessProbe"]["grpc"]["service"] == f"dranet.{name}"
        assert c["livenessProbe"]["grpc"]["service"] == "liveness"
        assert c["startupProbe"]["grpc"]["port"] == c["readinessProbe"]["grpc"]["port"]
        assert c["startupProbe"]["grpc"]["service"] == ("dranet.store" if name == "store" else "liveness")
    ports = {c["readinessProbe"]["grpc"]["port"] for c in containers.values()}
    assert len(ports) == 4, "each container has a health port of its own"
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert {"app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version"} <= set(
        labels
    )
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux"}


@pytest.mark.parametrize(
    ("expr", "want"),
    [
        (
            'attributes["dra.net/ifName"].StringValue != "a: b #c"',
            '--filter=attributes["dra.net/ifName"].StringValue != "a: b #c"',
        ),
        ("", "--filter="),
    ],
    ids=["colon-and-hash", "empty-publishes-all"],
)
def test_the_filter_reaches_inventory_as_written(expr: str, want: str) -> None:
    (ds,) = by_kind(render({"inventory": {"filter": expr}}), "DaemonSet")
    inv = next(c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "inventory")
    assert [a for a in inv["args"] if a.startswith("--filter")] == [want]


@pytest.mark.parametrize(
    ("values", "error"),
    [
        ({"atach": {"logLevel": "DEBUG"}}, "additional properties 'atach' not allowed"),
        ({"attach": {"healthPort": "9184"}}, "/attach/healthPort"),
        ({"inventory": {"cloudProviderHint": "gce"}}, "/inventory/cloudProviderHint"),
        ({"store": {"logLevel": "LOUD"}}, "/store/logLevel"),
        ({"metrics": {"port": 0}}, "/metrics/port"),
    ],
    ids=["typo", "wrong-type", "unknown-hint", "unknown-level", "port-range"],
)
def test_helm_refuses_bad_values(values: dict[str, Any], error: str) -> None:
    with pytest.raises(Exception, match=re.escape(error)):
        render(values)


def test_notes_say_how_to_check_it() -> None:
    with helm.Chart.load(str(CHART)) as chart:
        notes = chart.render({}, name="dranet", namespace="kube-system")["dranet/templates/NOTES.txt"]
    assert "dranet-admin health" in notes and "/metrics" in notes and "nri" in notes.lower()


def test_kubelet_root_dir_is_one_value_for_host_and_mount_paths() -> None:
    (ds,) = by_kind(render({"kubeletRootDir": "/data/kubelet"}), "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert host["kubelet-plugins"] == "/data/kubelet/plugins"
    assert host["kubelet-plugins-registry"] == "/data/kubelet/plugins_registry"
    prepare = next(c for c in spec["containers"] if c["name"] == "prepare")
    attach = next(c for c in spec["containers"] if c["name"] == "attach")
    assert {m["name"]: m["mountPath"] for m in attach["volumeMounts"]}["netns"] == host["netns"]
    mounts = {m["name"]: m["mountPath"] for m in prepare["volumeMounts"]}
    assert mounts["kubelet-plugins"] == "/data/kubelet/plugins"
    assert mounts["kubelet-plugins-registry"] == "/data/kubelet/plugins_registry"
    assert "--kubelet-root-dir=/data/kubelet" in prepare["args"]


def test_rbac_allows_what_the_services_do_and_no_more() -> None:
    docs = render()
    (role,) = by_kind(docs, "ClusterRole")
    grants = {
        (g, r, v)
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    for needed in [
        ("resource.k8s.io", "resourceslices", "create"),
        ("resource.k8s.io", "resourceslices", "watch"),
        ("resource.k8s.io", "resourceclaims", "get"),
        ("resource.k8s.io", "resourceclaims/status", "patch"),
        ("", "events", "create"),
        ("", "nodes", "get"),
        # prepare's claim read-ahead watches the node's Pods (services/prepare/prefetch.py).
        ("", "pods", "list"),
        ("", "pods", "watch"),
    ]:
        assert needed in grants
    assert not [g for g in grants if g[2] in ("*", "deletecollection") or g[1] == "secrets"]
    assert {v for g, r, v in grants if r == "pods"} == {"list", "watch"}
    (binding,) = by_kind(docs, "ClusterRoleBinding")
    assert binding["subjects"][0]["name"] == "dranet"
