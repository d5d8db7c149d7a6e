"""Every flag the Helm chart and compose.yaml pass to a service is one that
service's own argument parser accepts, with the values it can parse."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from services.attach.__main__ import parse_args as attach_args
from services.inventory.__main__ import build_parser as inventory_parser
from services.prepare.__main__ import parse_args as prepare_args
from services.store.__main__ import parse_args as store_args
from tests.integration.chart.test_chart import by_kind, render
from tests.integration.chart.test_compose import COMPOSE

REPO = Path(__file__).resolve().parents[3]
PARSERS: dict[str, Callable[[list[str]], argparse.Namespace]] = {
    "store": store_args,
    "inventory": lambda argv: inventory_parser().parse_args(argv),
    "prepare": prepare_args,
    "attach": attach_args,
}


def parse(service: str, argv: list[str]) -> argparse.Namespace:
    err = io.StringIO()
    argv = [a.replace("$(NODE_NAME)", "node-a").replace("$(POD_IP)", "10.1.2.3") for a in argv]
    try:
        with contextlib.redirect_stderr(err):
            return PARSERS[service](argv)
    except SystemExit:
        pytest.fail(f"{service} refuses {argv}: {err.getvalue().strip()}")


@pytest.mark.parametrize(
    "values",
    [
        {},
        {
            "inventory": {"filter": "true", "cloudProviderHint": "GCE", "webhookUrl": "https://hook:8443"},
            "kubeletRootDir": "/data/kubelet",
        },
    ],
    ids=["defaults", "everything-set"],
)
def test_chart_flags_parse(values: dict[str, Any]) -> None:
    (ds,) = by_kind(render(values), "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    for c in spec["initContainers"] + spec["containers"]:
        args = parse(c["name"], c["args"])
        assert args.health_address == "10.1.2.3" and args.health_port == c["readinessProbe"]["grpc"]["port"]
        assert args.run_dir == "/var/run/dranet"
        if c["name"] == "prepare":
            assert args.kubelet_root_dir == values.get("kubeletRootDir", "/var/lib/kubelet")
            assert args.node_name == "node-a"
        if c["name"] == "inventory":
            assert args.min_poll_interval == 5.0 and args.max_poll_interval == 60.0


def test_compose_flags_parse() -> None:
    compose = COMPOSE
    out = subprocess.run(
        [str(compose), "-f", str(REPO / "compose.yaml"), "config", "--format", "json"],
        check=True,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    for name, svc in json.loads(out.stdout)["services"].items():
        assert svc["command"][:3] == ["python", "-m", f"services.{name}"]
        parse(name, svc["command"][3:])
