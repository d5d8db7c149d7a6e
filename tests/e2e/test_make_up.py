"""The README's first command, as a process: every service, the control plane
and containerd start on this host, a demo Pod gets its NIC (name, MTU, address,
reaching its peer), the claim status shows it, and the NIC comes back."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from dev.cluster.up import Node

pytestmark = [pytest.mark.root, pytest.mark.netns, pytest.mark.containerd, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def test_up_runs_the_demo_and_stops_cleanly() -> None:
    with tempfile.TemporaryDirectory(prefix="up-") as state:
        res = subprocess.run(
            [
                sys.executable,
                "-m",
                "services.devcluster",
                "up",
                "--state-dir",
                state,
                "--netns",
                "dranet-e2e-up",
                "--demo",
                "--exit-after",
                "1",
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
        )
    lines = res.stdout.splitlines()
    demo = [json.loads(line)["demo"] for line in lines if line.startswith('{"demo"')]
    ready = [json.loads(line) for line in lines if line.startswith('{"ready"')]
    tail = "\n".join(lines[-40:]) + res.stderr[-2000:]
    assert res.returncode == 0, tail
    assert ready and ready[0]["nics"] == ["eth1", "eth2"], tail
    assert demo and demo[0]["ok"] is True, json.dumps(demo, indent=1)
    d = demo[0]
    assert d["interface"]["name"] == "net1" and d["interface"]["mtu"] == 1400
    assert "192.168.101.10/24" in d["interface"]["addresses"] and d["ping_peer"] is True
    (status,) = d["claim_status"]
    assert status["network_data"]["interface_name"] == "net1"
    assert {c["type"] for c in status["conditions"]} >= {"Ready"}
    assert d["returned_to_node"] is True
    assert "[up] stopped" in res.stdout
    # Nothing left behind: the node namespace and the host-side links are gone.
    assert (
        "dranet-e2e-up" not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    )
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    node = Node("dranet-e2e-up", 2)
    assert (
        f"{node.api_link}@" not in links and f"{node.peer}1@" not in links and f"{node.peer}2@" not in links
    )
