"""compose.yaml, checked by docker-compose v2 itself (`config`), as the CI does."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
COMPOSE = Path(os.environ.get("DRANET_CACHE", "/var/cache/dranet-dev")) / "tools" / "bin" / "docker-compose"


def test_compose_config_is_valid_and_shares_the_run_dir() -> None:
    assert COMPOSE.exists(), "run .ci/setup: it fetches docker-compose into $DRANET_CACHE/tools"
    out = subprocess.run(
        [str(COMPOSE), "-f", str(REPO / "compose.yaml"), "config", "--format", "json"],
        check=True,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "NODE_NAME": "node-a"},
    )
    cfg = json.loads(out.stdout)
    services = cfg["services"]
    assert sorted(services) == ["attach", "inventory", "prepare", "store"]
    for name, svc in services.items():
        assert svc["command"][:3] == ["python", "-m", f"services.{name}"]
        assert svc["network_mode"] == "host"
        targets = {v["target"]: v["source"] for v in svc["volumes"]}
        assert targets["/var/run/dranet"] == "/var/run/dranet", name
    assert services["attach"]["privileged"] is True
    assert "privileged" not in services["store"]
    assert "--node-name=node-a" in services["prepare"]["command"]


def test_compose_host_paths_follow_the_environment() -> None:
    """What dev/compose.py sets for its cluster: every host path moves, the image is the one
    loaded into Podman (never pulled), each service is judged by its own dranet.admin.v1 health."""
    env = {
        "PATH": "/usr/bin:/bin",
        "DRANET_IMAGE": "docker.io/library/dranet-py:test",
        "DRANET_RUN_DIR_HOST": "/s/run",
        "DRANET_STORE_DIR_HOST": "/s/store",
        "DRANET_INVENTORY_DIR_HOST": "/s/inventory",
        "KUBELET_ROOT_DIR": "/s/kubelet",
        "NRI_DIR": "/s/nri",
        "NETNS_DIR": "/run/netns",
        "INVENTORY_KUBECONFIG": "/s/inventory.kubeconfig",
        "PREPARE_KUBECONFIG": "/s/prepare.kubeconfig",
        "INVENTORY_FILTER": '"dra.net/ifName" in attributes && attributes["dra.net/ifName"].StringValue != "apilink"',
        "CLOUD_PROVIDER_HINT": "NONE",
    }
    out = subprocess.run(
        [str(COMPOSE), "-f", str(REPO / "compose.yaml"), "config", "--format", "json"],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    )
    services = json.loads(out.stdout)["services"]
    sources = {name: {v["target"]: v["source"] for v in svc["volumes"]} for name, svc in services.items()}
    assert sources["store"] == {"/var/run/dranet": "/s/run", "/var/lib/dranet/store": "/s/store"}
    assert sources["inventory"]["/etc/dranet/kubeconfig"] == "/s/inventory.kubeconfig"
    assert sources["inventory"]["/var/lib/dranet/inventory"] == "/s/inventory"
    assert sources["prepare"]["/etc/dranet/kubeconfig"] == "/s/prepare.kubeconfig"
    assert sources["prepare"]["/s/kubelet/plugins"] == "/s/kubelet/plugins"
    assert sources["prepare"]["/s/kubelet/plugins_registry"] == "/s/kubelet/plugins_registry"
    assert sources["attach"]["/s/nri"] == "/s/nri" and sources["attach"]["/run/netns"] == "/run/netns"
    (netns,) = [v for v in services["attach"]["volumes"] if v["target"] == "/run/netns"]
    assert netns["bind"]["propagation"] == "rslave"
    assert "--nri-socket=/s/nri/nri.sock" in services["attach"]["command"]
    assert f"--filter={env['INVENTORY_FILTER']}" in services["inventory"]["command"]
    assert "--cloud-provider-hint=NONE" in services["inventory"]["command"]
    assert "--kubelet-root-dir=/s/kubelet" in services["prepare"]["command"]
    for name, svc in services.items():
        assert svc["image"] == "docker.io/library/dranet-py:test" and svc["pull_policy"] == "never"
        assert svc["healthcheck"]["test"] == ["CMD", "dranet-admin", "health", name]
        assert not any("infiniband" in t for t in sources[name]), "an optional mount: compose.override.yaml"
    for name in ("inventory", "prepare", "attach"):
        assert services[name]["depends_on"]["store"]["condition"] == "service_healthy"
