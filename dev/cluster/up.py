"""The local run (``make up``): a real single-node Kubernetes on this host (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, containerd with NRI, the kubelet) and dranet installed on
it as operators install it: the product image built here (dev/image) and imported into the node's
containerd, charts/dranet installed into kube-system by a real Helm engine. ``--host-processes``
runs the four services as host processes instead (quicker to iterate on, no image build).

The node's NICs are veth links in a network namespace of their own (``--netns``, default
``dranet-node``) whose peers stay on the host, so a claim can never take the machine's own uplink;
the inventory and attach run inside it, as in the DaemonSet pod on a node. ``--demo`` applies a
DeviceClass, a ResourceClaim and a Pod once everything is ready and prints what the Pod got; the Pod
keeps running, so kubectl can look at it. Ctrl-C (or SIGTERM) deletes the Pods (their NICs come
back), stops everything in reverse order and removes what the run created.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

from dev.cluster import demo
from dev.cluster.driver import Driver
from dev.cluster.install import NAMESPACE, Installed
from dev.cluster.kube import KubeCluster, build

NODE = "dev-node"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--state-dir", default=os.environ.get("DRANET_DEV_STATE", "/var/lib/dranet-dev"))
    p.add_argument("--netns", default="dranet-node", help="network namespace holding the node's NICs")
    p.add_argument("--nics", type=int, default=2, help="veth NICs to give the node (eth1..ethN)")
    p.add_argument("--log-level", default="INFO", help="the four services' log level")
    p.add_argument("--demo", action="store_true", help="run a Pod with a NIC once everything is ready")
    p.add_argument(
        "--host-processes",
        action="store_true",
        help="run the four services as host processes instead of helm-installing the image",
    )
    p.add_argument(
        "--exit-after",
        type=float,
        default=0.0,
        help="stop this many seconds after everything is ready (and the demo ran); 0: run until Ctrl-C",
    )


def say(msg: str) -> None:
    print(f"[up {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    build()
    state = Path(args.state_dir).resolve()
    Driver.reap_stale(state / "driver")
    if KubeCluster.reap_stale(state):
        say(f"cleaned up after an earlier run in {state} that did not stop")
    if state.exists():
        shutil.rmtree(state)  # a fresh cluster each run: certificates, etcd, logs
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    cluster = KubeCluster(state, node_name=NODE, netns=args.netns)
    driver: Driver | None = None
    installed: Installed | None = None
    code = 0
    try:
        say(f"starting Kubernetes {cluster.kube_version} (etcd {cluster.etcd_version}) in {state}")
        cluster.start()
        say(f"node {NODE} Ready ({time.monotonic() - t0:.1f}s)")
        for i in range(1, args.nics + 1):
            cluster.net.add_nic(
                f"eth{i}", addresses=[f"192.168.{100 + i}.2/24"], peer_addresses=[f"192.168.{100 + i}.1/24"]
            )
        kubectl = f"{cluster.bin('kubectl')} --kubeconfig {cluster.kubeconfig}"
        if args.host_processes:
            driver = Driver(cluster, log_level=args.log_level).start()
            logs = str(driver.workdir)
            say(f"dranet's four services running ({time.monotonic() - t0:.1f}s); logs in {logs}")
        else:
            installed = Installed(cluster)
            say("building the image (cached when unchanged) and importing it into the node's containerd")
            image = installed.ensure_image()
            say(f"helm install dranet ({image}) into {NAMESPACE}")
            level = args.log_level
            installed.install({c: {"logLevel": level} for c in ("store", "inventory", "prepare", "attach")})
            logs = f"{kubectl} -n {NAMESPACE} logs ds/dranet -c <store|inventory|prepare|attach>"
            say(
                f"dranet's pod Ready, its four containers judged by their gRPC probes "
                f"({time.monotonic() - t0:.1f}s; helm install to Ready {installed.installed_s:.1f}s)"
            )
        print(
            json.dumps(
                {
                    "ready": True,
                    "ready_s": round(time.monotonic() - t0, 1),
                    "kubernetes": cluster.kube_version,
                    "kubeconfig": str(cluster.kubeconfig),
                    "kubectl": str(cluster.bin("kubectl")),
                    "node": NODE,
                    "node_netns": args.netns,
                    "nics": [f"eth{i}" for i in range(1, args.nics + 1)],
                    "logs": [str(cluster.logs), logs],
                    "metrics": f"http://{cluster.net.node_ip}:9177/metrics" if installed else None,
                    "try": f"{kubectl} get resourceslices -o yaml",
                }
            ),
            flush=True,
        )
        if args.demo:
            result = demo.run(cluster)
            result["running_s"] = round(time.monotonic() - t0, 1)
            print(json.dumps({"demo": result}, default=str), flush=True)
            if not result.get("ok"):
                code = 1
            else:
                say(f"the demo Pod runs with its NIC: {kubectl} describe pod demo")
        say("running; Ctrl-C stops everything")
        deadline = time.monotonic() + args.exit_after if args.exit_after else None
        while not stop.is_set():
            procs = {**cluster.procs, **(driver.procs if driver else {})}
            dead = [n for n, p in procs.items() if not _alive(p)]
            if dead:
                say(f"{dead[0]} exited; stopping")
                return 1
            if deadline is not None and time.monotonic() >= deadline:
                break
            stop.wait(0.5)
        return code
    except Exception as exc:
        print(f"[up] failed: {exc}", file=sys.stderr, flush=True)
        if driver is not None:
            print(driver.logs(2000), file=sys.stderr, flush=True)
        if installed is not None:
            with contextlib.suppress(Exception):
                print(installed.logs(installed.pod(), 200), file=sys.stderr, flush=True)
        return 1
    finally:
        # Pods go while attach runs, so StopPodSandbox gives their NICs back.
        cluster.delete_pods(namespaces_except=(NAMESPACE,))
        if installed is not None:
            with contextlib.suppress(Exception):
                installed.uninstall()
        back = [f"eth{i}" for i in range(1, args.nics + 1) if cluster.net.has_link(f"eth{i}")]
        print(json.dumps({"stopped": True, "nics_on_node": back}), flush=True)
        if driver is not None:
            driver.stop()
        cluster.stop()
        say("stopped")


def _alive(p: object) -> bool:
    proc = getattr(p, "proc", None) or getattr(p, "popen", None)
    return proc is not None and proc.poll() is None
