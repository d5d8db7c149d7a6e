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
