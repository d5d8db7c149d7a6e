"""The local run (``make up``): dranet's four services, each its own process,
with the development control plane and a real containerd, on this host.

The node's devices live in a network namespace made for the run (``--netns``,
default ``dranet-node``) holding a few veth "NICs" whose peers stay on the
host, so a claim can never take the machine's own uplink. The inventory and
attach run inside that namespace, as they would in the DaemonSet pod on a
node (hostNetwork); the control plane, containerd, the kubelet emulator, the
store and prepare run on the host. Ctrl-C (or SIGTERM) stops everything in
reverse order and removes what the run created.

``--demo`` applies a DeviceClass, a ResourceClaim and a Pod once everything is
ready, waits for the Pod to run with its NIC, prints what the Pod got, deletes
it and checks the NIC came back.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
NODE = "dev-node"
API_HOST, API_NODE = "169.254.123.1", "169.254.123.2"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--state-dir", default=os.environ.get("DRANET_DEV_STATE", "/var/lib/dranet-dev"))
    p.add_argument("--netns", default="dranet-node", help="network namespace standing in for the node")
    p.add_argument("--nics", type=int, default=2, help="veth NICs to give the node (eth1..ethN)")
    p.add_argument("--log-level", default="INFO")
    p.add_argument("--demo", action="store_true", help="run a Pod with a NIC once ready, then remove it")
    p.add_argument(
        "--exit-after",
        type=float,
        default=0.0,
        help="stop this many seconds after everything is ready (and the demo ran); 0: run until Ctrl-C",
    )


@dataclass
class Child:
    name: str
    argv: list[str]
    socket: Path | None = None
    ready_json: bool = False
    netns: str | None = None
    proc: subprocess.Popen[bytes] | None = None
    lines: queue.Queue[dict[str, Any]] = field(default_factory=queue.Queue)

    def start(self, timeout: float = 60.0) -> dict[str, Any]:
        argv = ["ip", "netns", "exec", self.netns, *self.argv] if self.netns else self.argv
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        threading.Thread(target=self._pump, daemon=True).start()
        deadline = time.monotonic() + timeout
        info: dict[str, Any] = {}
        if self.ready_json:
            while not info:
                try:
                    info = self.lines.get(timeout=0.1)
                except queue.Empty:
                    self._check(deadline)
        if self.socket is not None:
            while not _connectable(self.socket):
                self._check(deadline)
                time.sleep(0.05)
        return info

    def _check(self, deadline: float) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited with code {self.proc.returncode} during start-up")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{self.name} not ready in time")

    def _pump(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace")
            if self.ready_json and line.startswith("{") and '"level"' not in line:
                with contextlib.suppress(ValueError):
                    self.lines.put(json.loads(line))
                    continue
            sys.stdout.write(f"{self.name:>12} | {line}")
            sys.stdout.flush()

    def stop(self, timeout: float = 60.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def _connectable(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.connect(str(path))
            return True
        except OSError:
            return False


def sh(*argv: str, check: bool = True) -> str:
    res = subprocess.run(list(argv), capture_output=True, text=True)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {res.stderr.strip()}")
    return res.stdout


class Node:
    """The node's network namespace: a link to the host for the API server, and NICs."""

    def __init__(self, netns: str, nics: int) -> None:
        self.netns = netns
        self.nics = nics
        # Host-side link names derived from the namespace, so two runs with
        # different namespaces never delete each other's links.
        tag = hashlib.sha1(netns.encode()).hexdigest()[:4]
        self.api_link = f"dn{tag}-api"
        self.peer = f"dn{tag}-p"

    def create(self) -> None:
        self.delete()  # a namespace left by a killed run
        sh("ip", "netns", "add", self.netns)
        sh("ip", "-n", self.netns, "link", "set", "lo", "up")
        sh("ip", "link", "add", self.api_link, "type", "veth", "peer", "name", "apilink", "netns", self.netns)
        sh("ip", "addr", "add", f"{API_HOST}/30", "dev", self.api_link)
        sh("ip", "link", "set", self.api_link, "up")
        sh("ip", "-n", self.netns, "addr", "add", f"{API_NODE}/30", "dev", "apilink")
        sh("ip", "-n", self.netns, "link", "set", "apilink", "up")
        for i in range(1, self.nics + 1):
            peer = f"{self.peer}{i}"
            sh("ip", "link", "add", peer, "type", "veth", "peer", "name", f"eth{i}", "netns", self.netns)
            sh("ip", "addr", "add", f"192.168.{100 + i}.1/24", "dev", peer)
            sh("ip", "link", "set", peer, "up")
            sh("ip", "-n", self.netns, "addr", "add", f"192.168.{100 + i}.2/24", "dev", f"eth{i}")
            sh("ip", "-n", self.netns, "link", "set", f"eth{i}", "up")

    def delete(self) -> None:
        sh("ip", "netns", "del", self.netns, check=False)
        sh("ip", "link", "del", self.api_link, check=False)
        for i in range(1, max(self.nics, 8) + 1):
            sh("ip", "link", "del", f"{self.peer}{i}", check=False)


def run(args: argparse.Namespace) -> int:
    state = Path(args.state_dir).resolve()
    run_dir, kubelet_dir = state / "run", state / "kubelet"
    for d in (state, run_dir, kubelet_dir):
        d.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    level = ["--log-level", args.log_level]
    node = Node(args.netns, args.nics)
    started: list[Child] = []
    stop_event = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop_event.set())
    signal.signal(signal.SIGINT, lambda *_: stop_event.set())

    def start(child: Child, timeout: float = 60.0) -> dict[str, Any]:
        t0 = time.monotonic()
        info = child.start(timeout)
        started.append(child)
        print(f"[up] {child.name} ready in {time.monotonic() - t0:.2f}s", flush=True)
        return info

    def service(name: str, *flags: str, netns: str | None = None) -> Child:
        """One of dranet's services, its socket in the run dir."""
        return Child(
            name,
            [py, "-m", f"services.{name}", "--run-dir", str(run_dir), *flags, *level],
            socket=run_dir / f"{name}.sock",
            netns=netns,
        )

    code = 0
    kubeconfig = ""
    try:
        node.create()
        cp = start(
            Child(
                "controlplane",
                [
                    py,
                    "-m",
                    "services.devcluster.controlplane",
                    "--state-dir",
                    str(state / "controlplane"),
                    "--host",
                    API_HOST,
                    "--node",
                    NODE,
                    *level,
                ],
                ready_json=True,
            )
        )
        kubeconfig = cp["kubeconfig"]
        ctrd = start(
            Child(
                "containerd",
                [py, "-m", "services.devcluster.containerd", "run", "--workdir", str(state / "containerd")],
                ready_json=True,
            ),
            timeout=120,
        )
        start(service("store", "--db-dir", str(state / "store")))
        start(
            service(
                "inventory",
                "--node-name",
                NODE,
                "--kubeconfig",
                kubeconfig,
                "--cloud-provider-hint",
                "NONE",
                # veth stand in for NICs here: publish them, but not the API link.
                "--filter",
                'attributes["dra.net/ifName"].StringValue != "apilink"',
                netns=args.netns,
            )
        )
        start(service("attach", "--nri-socket", ctrd["nri_socket"], netns=args.netns))
        start(
            service(
                "prepare",
                "--node-name",
                NODE,
                "--kubeconfig",
                kubeconfig,
                "--kubelet-root-dir",
                str(kubelet_dir),
            )
        )
        start(
            Child(
                "kubelet",
                [
                    py,
                    "-m",
                    "services.devcluster.kubelet",
                    "--node-name",
                    NODE,
                    "--root-dir",
                    str(kubelet_dir),
                    "--kubeconfig",
                    kubeconfig,
                    "--runtime-endpoint",
                    ctrd["grpc_socket"],
                    *level,
                ],
            )
        )
        print(
            json.dumps(
                {
                    "ready": True,
                    "kubeconfig": kubeconfig,
                    "node": NODE,
                    "node_netns": args.netns,
                    "nics": [f"eth{i}" for i in range(1, args.nics + 1)],
                    "run_dir": str(run_dir),
                    "try": f"kubectl --kubeconfig {kubeconfig} get resourceslices -o wide",
                }
            ),
            flush=True,
        )
        if args.demo:
            from services.devcluster import demo

            result = demo.run(kubeconfig, args.netns)
            print(json.dumps({"demo": result}, default=str), flush=True)
            if not result.get("ok"):
                code = 1
        deadline = time.monotonic() + args.exit_after if args.exit_after else None
        while not stop_event.is_set():
            dead = [c for c in started if not c.alive()]
            if dead:
                print(
                    f"[up] {dead[0].name} exited with code {dead[0].proc.returncode if dead[0].proc else '?'}",
                    flush=True,
                )
                return 1
            if deadline is not None and time.monotonic() >= deadline:
                break
            stop_event.wait(0.5)
        return code
    except Exception as exc:
        print(f"[up] failed: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        if kubeconfig and any(c.name == "kubelet" and c.alive() for c in started):
            # Give devices back before the runtime goes: delete the pods and let
            # the kubelet stop them (StopPodSandbox returns their NICs).
            from services.devcluster import demo

            with contextlib.suppress(Exception):
                demo.delete_all_pods(kubeconfig, within=60)
        for child in reversed(started):
            with contextlib.suppress(Exception):
                child.stop()
        node.delete()
        print("[up] stopped", flush=True)
