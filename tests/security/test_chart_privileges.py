"""Privileges as the chart grants them, rendered by the real Helm engine: per container
the capabilities, privilege, escalation, read-only root, and who gets an API token.

Least privilege per component: the store needs no capability at all; inventory
NET_ADMIN (netlink), BPF and SYS_ADMIN (TCX program names); prepare NET_ADMIN and
NET_RAW (the DHCP client); only attach is privileged (setns into pod netns, moving
devices). Only inventory and prepare call the API server, so only they mount the
projected kube-api-access token; the pod does not automount one."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.chart.test_chart import by_kind, render

ADDS = {
    "store": set(),
    "inventory": {"NET_ADMIN", "BPF", "SYS_ADMIN"},
    "prepare": {"NET_ADMIN", "NET_RAW"},
}
WITH_TOKEN = {"inventory", "prepare"}
TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def pod_spec(values: dict[str, Any] | None = None) -> dict[str, Any]:
    (ds,) = by_kind(render(values), "DaemonSet")
    spec: dict[str, Any] = ds["spec"]["template"]["spec"]
    return spec


def containers(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in spec.get("initContainers", []) + spec["containers"]}


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    return pod_spec()


def test_the_four_containers_are_all_there(spec: dict[str, Any]) -> None:
    assert sorted(containers(spec)) == ["attach", "inventory", "prepare", "store"]


@pytest.mark.parametrize("name", sorted(ADDS))
def test_unprivileged_containers_drop_all_and_add_only_what_they_need(
    spec: dict[str, Any], name: str
) -> None:
    sc = containers(spec)[name]["securityContext"]
    assert sc.get("privileged", False) is False
    caps = sc["capabilities"]
    assert caps["drop"] == ["ALL"]
    assert set(caps.get("add", [])) == ADDS[name]
    assert len(caps.get("add", [])) == len(ADDS[name]), "no capability listed twice"
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True


def test_only_attach_is_privileged(spec: dict[str, Any]) -> None:
    privileged = sorted(n for n, c in containers(spec).items() if c["securityContext"].get("privileged"))
    assert privileged == ["attach"]
    assert containers(spec)["attach"]["securityContext"]["readOnlyRootFilesystem"] is True


def test_no_container_gets_a_host_namespace_beyond_the_network(spec: dict[str, Any]) -> None:
    # hostNetwork: the devices to publish and move live in the node's netns.
    assert spec["hostNetwork"] is True
    assert not spec.get("hostPID") and not spec.get("hostIPC")


def test_only_inventory_and_prepare_hold_an_api_token(spec: dict[str, Any]) -> None:
    assert spec["automountServiceAccountToken"] is False
    projected = {v["name"] for v in spec["volumes"] if "projected" in v}
    assert projected == {"kube-api-access"}
    (vol,) = [v for v in spec["volumes"] if v["name"] == "kube-api-access"]
    assert any("serviceAccountToken" in s for s in vol["projected"]["sources"])
    for name, c in containers(spec).items():
        mounts = c.get("volumeMounts", [])
        token_mounts = [m for m in mounts if m["name"] == "kube-api-access"]
        assert bool(token_mounts) == (name in WITH_TOKEN), name
        for m in token_mounts:
            assert m["mountPath"] == TOKEN_DIR and m.get("readOnly") is True
        # Nothing else is mounted where a client library looks for a token.
        assert not [
            m for m in mounts if m["mountPath"].startswith(TOKEN_DIR) and m["name"] != "kube-api-access"
        ]


def test_a_custom_values_file_keeps_the_same_privileges() -> None:
    # Image and resource overrides must not change the security settings.
    spec = pod_spec(
        {"image": {"repository": "example/dranet", "tag": "9.9.9"}, "kubeletRootDir": "/data/kubelet"}
    )
    for name, c in containers(spec).items():
        sc = c["securityContext"]
        if name == "attach":
            assert sc.get("privileged") is True
        else:
            assert (
                sc["capabilities"]["drop"] == ["ALL"] and set(sc["capabilities"].get("add", [])) == ADDS[name]
            )
