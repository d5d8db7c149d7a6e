"""Pod churn under faults on the real cluster with the helm-installed driver: the bounded run CI
does (tests/bench/soak.py is the long one). tests/support/churn.py holds the workers, the fault
injector and the invariants; this module runs it once with every fault kind and asserts that no
invariant broke and that the services' logs hold no ERROR line or traceback that an injected fault
does not explain. The counts are printed (``pytest -s``) and written to the JUnit properties.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dev.cluster.install import NAMESPACE, Installed
from dev.cluster.kube import KubeCluster
from tests.support.churn import FAULTS, Churn, LogReader, classify
from tests.support.kube import Kube

PODS = int(os.environ.get("DRANET_CHURN_PODS", "24"))


@pytest.fixture(scope="module")
def installed(kube_cluster: KubeCluster) -> Iterator[Installed]:
    inst = Installed(kube_cluster)
    try:
        inst.install()
    except BaseException:
        print(inst.logs(inst.pod()))
        inst.uninstall()
        raise
    try:
        yield inst
    finally:
        kube_cluster.delete_pods(namespaces_except=(NAMESPACE,))
        inst.uninstall()


@pytest.mark.root
@pytest.mark.netns
@pytest.mark.containerd
@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.timeout(1800)
async def test_churn_under_every_fault_keeps_every_promise(
    kube_cluster: KubeCluster,
    installed: Installed,
    kube: Kube,
    record_property: Callable[[str, object], None],
) -> None:
    # Each fault 10-20 s after the node recovered from the last one: closer, the Pods wait through
    # back-to-back outages and the run measures the kubelet's restart back-off, not the driver.
    churn = Churn(kube_cluster, installed, kube, pods=PODS, nics=4, fault_gap_s=(10.0, 20.0), api_down_s=30.0)
    try:
        report = await churn.run()
    finally:
        kube.delete_namespace()
        await churn.cleanup()
        logs = Path(tempfile.mkdtemp(prefix="dranet-churn-logs-"))
        churn.logs.dump(logs)
    summary = report.summary()
    print("churn:", json.dumps(summary))
    print("the services' logs:", logs)
    print("error lines an injected fault explains:", *report.explained[:40], sep="\n  ")
    print("Pods that got their device late:", *churn.late, sep="\n  ")
    for k, v in summary.items():
        record_property(k, v)
    assert set(report.faults) == set(FAULTS), f"fault kinds not injected: {set(FAULTS) - set(report.faults)}"
    assert report.pods_ran >= PODS, summary
    assert report.violations == [], f"{report.violations} (logs: {logs})"
    assert report.unexplained == [], "\n".join(report.unexplained[:10])
    assert summary["leaked_devices"] == summary["lost_configs"] == 0
    assert summary["pods_started_without_devices"] == 0
    # A Pod may get its device late only after a fault that took attach away while its sandbox
    # was (re)built; never in quiet times.
    assert "none" not in report.late_after, churn.late


# --- the log check itself can fail -----------------------------------------------------------------


class _FakeCluster:
    def __init__(self, state: Path) -> None:
        self.state = state


def test_the_log_check_finds_error_lines_and_tracebacks(tmp_path: Path) -> None:
    """The churn's log invariant reads the kubelet's CRI log files of the driver pod: an ERROR
    record, a traceback inside a record and a bare traceback line are each found; INFO is not."""
    d = tmp_path / "pod-logs" / f"{NAMESPACE}_dranet-x_uid" / "attach"
    d.mkdir(parents=True)
    lines = [
        {"ts": "2026-01-01T00:00:00Z", "level": "INFO", "msg": "ok"},
        {"ts": "2026-01-01T00:00:01Z", "level": "ERROR", "msg": "boom"},
        {
            "ts": "2026-01-01T00:00:02Z",
            "level": "WARNING",
            "msg": "x",
            "exc": "Traceback (most recent call last)",
        },
    ]
    text = "".join(f"2026-01-01T00:00:00Z stderr F {json.dumps(x)}\n" for x in lines)
    text += "2026-01-01T00:00:03Z stderr F Traceback (most recent call last):\n"
    (d / "0.log").write_text(text)
    reader = LogReader(_FakeCluster(tmp_path))  # type: ignore[arg-type]
    reader.poll()
    found = reader.errors()
    assert len(found) == 3, found
    assert any("boom" in line for _, line in found)
    assert found[0][0] > 0  # the record's own time, to match it against the faults


def test_an_error_line_is_explained_only_by_a_fault_it_names() -> None:
    """Within the fault's window and naming what it took away: explained; the same line at
    the same time but naming nothing of the fault, or long after it: unexplained."""
    faults = [(100.0, 110.0, "kill-store"), (200.0, 230.0, "stop-apiserver-etcd")]
    lines = [
        (105.0, '{"level": "ERROR", "msg": "store UNAVAILABLE: connect failed"}'),
        (106.0, '{"level": "ERROR", "msg": "KeyError in the plan"}'),
        (120.0, '{"level": "ERROR", "msg": "publish failed: HTTP 503 from the API server"}'),
        (215.0, '{"level": "ERROR", "msg": "publish failed: HTTP 503 from the API server"}'),
        (500.0, '{"level": "ERROR", "msg": "store UNAVAILABLE: connect failed"}'),
        # The service's own name is in every record of it: it explains nothing.
        (107.0, '{"level": "ERROR", "service": "store", "msg": "Task exception was never retrieved"}'),
    ]
    explained, unexplained = classify(lines, faults, grace_s=45.0)
    assert [e.split(":")[0] for e in explained] == ["kill-store", "stop-apiserver-etcd"]
    assert [json.loads(u)["msg"] for u in unexplained] == [
        "KeyError in the plan",
        "publish failed: HTTP 503 from the API server",
        "store UNAVAILABLE: connect failed",
        "Task exception was never retrieved",
    ]
