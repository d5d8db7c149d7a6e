"""The VM tier's host-side entry: boots the QEMU guest once (dev/vm/run.py) and runs the
guest suite tests/vm/guest/ inside it, on a Debian kernel with dummy, ipvlan, vrf,
netdevsim and rdma_rxe (this host's kernel has none of them).

It fails with the guest's pytest output unless the guest ran more than zero tests and
every one passed: a guest test that was skipped, deselected or never collected fails it
too, so the tier can never pass silently. Needs root, QEMU and the kernel cache that
dev/vm/install.sh fills (.ci/setup runs it; run.py runs it when the cache is missing).
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vm, pytest.mark.root, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
GUEST_SUITE = "tests/vm/guest"
# Whole run: boot (about 25 s under TCG), set-up, the suite; below pytest's 600 s timeout.
RUN_TIMEOUT_S = 540


def junit_counts(path: Path) -> tuple[dict[str, int], dict[str, collections.Counter[str]], list[str]]:
    """Totals, per-module outcome counts and the failing test ids of a junit xml file."""
    root = ET.parse(path).getroot()
    totals: collections.Counter[str] = collections.Counter()
    per_module: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    bad = []
    for case in root.iter("testcase"):
        module = case.get("classname", "?").rsplit(".", 1)[-1] if case.get("classname") else "?"
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = "skipped" if child.tag == "skipped" else "failed"
        totals[outcome] += 1
        totals["tests"] += 1
        per_module[module][outcome] += 1
        if outcome != "passed":
            bad.append(f"{case.get('classname')}::{case.get('name')} {outcome}")
    return dict(totals), per_module, bad


@pytest.mark.skipif(os.environ.get("DRANET_VM_GUEST") == "1", reason="already inside the guest")
def test_guest_suite_passes_in_the_vm() -> None:
    out = Path(tempfile.mkdtemp(prefix="dranet-vm-"))
    cmd = [sys.executable, str(ROOT / "dev/vm/run.py"), "--out", str(out), "--timeout", str(RUN_TIMEOUT_S)]
    cmd += ["-q", GUEST_SUITE, "--", "-p", "no:hypothesispytest", "-p", "no:anyio"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S + 30)
    guest_output = (out / "pytest.log").read_text(errors="replace") if (out / "pytest.log").exists() else ""
    report = f"{res.stderr[-6000:]}\n--- guest pytest ---\n{guest_output[-20000:]}"
    junit = out / "junit.xml"
    assert junit.exists(), f"the guest produced no results (run.py exit code {res.returncode}):\n{report}"
    totals, per_module, bad = junit_counts(junit)

    times = json.loads((out / "times.json").read_text()) if (out / "times.json").exists() else {}
    metrics = []
    if (out / "metrics.jsonl").exists():
        metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line]
    summary = ["", f"VM tier: {totals}; times (s): {times}"]
    summary += [f"  {m}: {dict(c)}" for m, c in sorted(per_module.items())]
    summary += [f"  metric {m}" for m in metrics]
    print("\n".join(summary))

    assert totals.get("tests", 0) > 0, f"the guest ran no test:\n{report}"
    assert not bad, "guest tests did not pass:\n  " + "\n  ".join(bad) + f"\n{report}"
    assert res.returncode == 0, f"guest pytest exit code {res.returncode}:\n{report}"
    shutil.rmtree(out, ignore_errors=True)  # kept for a look when anything failed
