"""dranet's four services as host processes beside a ``KubeCluster``, as the DaemonSet pod runs
them on a node: store and prepare in the host's network namespace, inventory and attach inside the
node's (hostNetwork there), prepare on the kubelet's root dir, attach on containerd's NRI socket.
The inventory and prepare each talk to the API server with a token of their own ServiceAccount,
bound to the chart's ClusterRole; attach and store hold no Kubernetes credentials.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import time
from collections.abc import Sequence
from pathlib import Path

from dev.cluster.kube import KubeCluster
from dev.cluster.procs import ServiceProcess

ORDER = ("store", "inventory", "attach", "prepare")
# The node namespace also holds its API link, containerd's CNI bridge (dncni*) and the host ends of
# the pods' eth0 veths (veth*): none of them is a NIC to hand out.
FILTER = (
    '"dra.net/ifName" in attributes && attributes["dra.net/ifName"].StringValue != "apilink"'
    ' && !attributes["dra.net/ifName"].StringValue.startsWith("dncni")'
    ' && !attributes["dra.net/ifName"].StringValue.startsWith("veth")'
)


class Driver:
    """``start()``, ``stop()``, ``restart(name, kill=...)``; ``procs[name]`` for each service."""

    def __init__(
        self,
        cluster: KubeCluster,
        inventory_args: Sequence[str] = (),
        prepare_args: Sequence[str] = (),
        attach_args: Sequence[str] = (),
        log_level: str = "DEBUG",
        workdir: Path | None = None,
    ) -> None:
        self.cluster = cluster
        self.workdir = workdir or cluster.state / "driver"
        self.run_dir = self.workdir / "run"
        self.log_level = log_level
        self.extra = {
            "inventory": list(inventory_args),
            "prepare": list(prepare_args),
            "attach": list(attach_args),
        }
        self.procs: dict[str, ServiceProcess] = {}
        self.kubeconfigs: dict[str, Path] = {}

    def _args(self, name: str) -> tuple[list[str], str | None]:
        c = self.cluster
        # Host processes are checked over their Unix sockets: no TCP health port (the host's
        # and the node's ports stay free for an installed driver and for other clusters).
        common = ["--run-dir", str(self.run_dir), "--log-level", self.log_level, "--health-port", "0"]
        if name == "store":
            return [*common, "--db-dir", str(self.workdir / "store")], None
        if name == "inventory":
            return [
                *common,
                "--node-name", c.node_name,
                "--kubeconfig", str(self.kubeconfigs["inventory"]),
                "--cloud-provider-hint", "NONE",
                "--min-poll-interval", "200ms",
                # veth stand in for NICs here: publish them, but never the node's API link, nor
                # a PCI NIC whose netdev is in the host's namespace (the machine's uplink).
                "--filter", FILTER,
                "--metrics-port", "0",
                *self.extra["inventory"],
            ], c.netns  # fmt: skip
        if name == "attach":
            assert c.containerd is not None
            return [*common, "--nri-socket", str(c.containerd.nri_socket), *self.extra["attach"]], c.netns
        return [
            *common,
            "--node-name", c.node_name,
            "--kubeconfig", str(self.kubeconfigs["prepare"]),
            "--kubelet-root-dir", str(c.kubelet_dir),
            # DHCP (interface.dhcp) runs on the NIC where it is: in the node's namespace.
            "--device-netns", f"/var/run/netns/{c.netns}",
            *self.extra["prepare"],
        ], None  # fmt: skip

    def process(self, name: str) -> ServiceProcess:
        args, netns = self._args(name)
        return ServiceProcess(
            f"services.{name}",
            args,
            socket=self.run_dir / f"{name}.sock",
            log_path=self.workdir / f"{name}.log",
            netns=netns,
        )

    def start(self) -> Driver:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for svc in ("inventory", "prepare"):
            if svc not in self.kubeconfigs:
                self.kubeconfigs[svc] = self.cluster.service_identity(svc)
        for name in ORDER:
            self.start_one(name)
        self.wait_registered()
        return self

    def wait_registered(self, timeout: float = 30.0) -> None:
        """Until the kubelet has accepted prepare's registration (a Pod created before that
        fails with 'DRA driver dra.net is not registered' and waits for the kubelet's retry)."""
        deadline = time.monotonic() + timeout
        proc = self.procs["prepare"]
        while "registered with the kubelet" not in proc.log():
            if proc.proc is not None and proc.proc.poll() is not None:
                raise RuntimeError(f"prepare exited:\n{proc.log()[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the kubelet did not register prepare in {timeout}s:\n{proc.log()[-3000:]}"
                )
            time.sleep(0.05)

    def start_one(self, name: str, timeout: float = 30.0) -> ServiceProcess:
        proc = self.process(name)
        self.procs[name] = proc
        proc.start(timeout)
        # For reap_stale, should this run be killed before it stops them.
        pids = {n: p.pid for n, p in self.procs.items() if p.proc is not None}
        (self.workdir / "driver.json").write_text(json.dumps({"pids": pids}))
        return proc

    @staticmethod
    def reap_stale(workdir: Path) -> None:
        """SIGKILL the services of a run in ``workdir`` that was killed before its stop."""
        try:
            pids = json.loads((workdir / "driver.json").read_text())["pids"]
        except (OSError, ValueError, KeyError):
            return
        for pid in pids.values():
            with contextlib.suppress(OSError):
                if "services." in Path(f"/proc/{pid}/cmdline").read_text(errors="replace"):
                    os.kill(int(pid), signal.SIGKILL)

    def restart(self, name: str, kill: bool = False) -> ServiceProcess:
        old = self.procs[name]
        old.kill() if kill else old.stop()
        return self.start_one(name)

    def stop(self, remove: bool = False) -> None:
        """Reverse order: prepare first (no new claims), the store last."""
        for name in reversed(ORDER):
            p = self.procs.get(name)
            if p is not None:
                with contextlib.suppress(Exception):
                    p.stop(timeout=30)
        if remove:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def logs(self, n: int = 6000) -> str:
        return "\n".join(f"--- {name} ---\n{p.log()[-n:]}" for name, p in self.procs.items())
