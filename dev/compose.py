"""compose.yaml run for real on the development cluster: Debian's Podman (its Docker-compatible API,
``podman system service``) and docker compose v2 bring the four containers up beside a running
``KubeCluster``. Development tooling: never in the image.

``Compose(cluster).up()``:

- A private Podman: ``containers.conf`` and ``storage.conf`` (passed by ``CONTAINERS_CONF`` and
  ``CONTAINERS_STORAGE_CONF`` to every podman process, the API service and the ``container
  cleanup`` processes conmon starts) put the storage, the run root, the locks (file locks, not
  ``/dev/shm/libpod_lock``), the events log and temporary files under ``<cluster state>/compose``;
  nothing of the host's ``/var/lib/containers`` or ``/run/libpod`` is used.
- The product image (``dev.image``, cached) is loaded into that storage.
- The API service runs in the node's network namespace (``nsenter --net``: only the network
  namespace changes), so the containers' ``network_mode: host`` is the node's, where its NICs,
  containerd and the kubelet are, as for the DaemonSet pod (hostNetwork).
- ``docker compose -f compose.yaml up -d --wait`` with the host paths of this cluster in the
  environment (compose.yaml's variables), each service's kubeconfig from
  ``KubeCluster.service_identity`` (the chart's RBAC) with the CA inline.

``down()`` removes the containers, stops the service and removes the directory, and what Podman
added on the host (its cgroups, the blob-info cache under /var/lib/containers) when it was not there
before. ``python -m dev.compose up`` does the same around a cluster of its own (``--demo``).

Two facts of this host shape the configuration: no CAP_SYS_RESOURCE (Podman's default
``nofile``/``nproc`` ulimits, above the hard limits, fail ``setrlimit`` in runc: ``default_ulimits``
is emptied so containers inherit the service's limits) and no systemd (cgroupfs, a file events log;
healthchecks are run by this harness, as systemd's timers would run them, see ``_healthchecks``).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from dev.cluster.driver import FILTER
from dev.cluster.kube import CACHE, KubeCluster

REPO = Path(__file__).resolve().parents[1]
COMPOSE_FILE = REPO / "compose.yaml"
COMPOSE_BIN = CACHE / "tools" / "bin" / "docker-compose"
PROJECT = "dranet"  # compose.yaml's name
SERVICES = ("store", "inventory", "prepare", "attach")
# Containerd makes pod network namespaces here; /var/run is a symlink to /run, and only /run/netns
# is a shared mount, which attach's rslave bind needs.
NETNS_DIR = "/run/netns"
STD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# How often a healthy container is checked again (compose.yaml's interval); one not yet healthy
# is checked every second, so `up --wait` returns soon after the services are ready.
RECHECK_S = 5.0


class ComposeError(RuntimeError):
    """A step of compose up or down failed; the message names it and carries the output."""


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self.path)
        self.sock = s


def libpod_cgroups() -> set[Path]:
    """Podman's cgroupfs parent (``libpod_parent``) and everything below it, in every hierarchy."""
    root = Path("/sys/fs/cgroup")
    tops = [root / "libpod_parent", *root.glob("*/libpod_parent")]
    return {Path(d) for top in tops if top.is_dir() for d, _, _ in os.walk(top)}


def processes_naming(needle: str | os.PathLike[str]) -> list[int]:
    """Processes whose command line holds ``needle`` (conmon, ``podman container cleanup``, the service)."""
    text = os.fsencode(needle)
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            with contextlib.suppress(OSError):
                if text in (proc / "cmdline").read_bytes():
                    out.append(int(proc.name))
    return out


class Compose:
    """compose.yaml on ``cluster`` through a private Podman (see the module docstring)."""

    def __init__(self, cluster: KubeCluster, log_level: str = "DEBUG", workdir: Path | None = None) -> None:
        self.cluster = cluster
        self.log_level = log_level
        self.dir = workdir or cluster.state / "compose"
        self.sock = self.dir / "podman.sock"
        self.service_log = cluster.logs / "podman-service.log"
        self.image = ""
        self.service: subprocess.Popen[bytes] | None = None
        self.timings: dict[str, float] = {}
        self._host = contextlib.ExitStack()
        self._cgroups_before: set[Path] = set()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    # -- paths and environments -------------------------------------------------------------------

    @property
    def node_dir(self) -> Path:
        """The host side of the containers' run, store and inventory directories."""
        return self.dir / "node"

    def podman_env(self) -> dict[str, str]:
        return {
            "PATH": os.environ.get("PATH", STD_PATH),
            "CONTAINERS_CONF": str(self.dir / "containers.conf"),
            "CONTAINERS_STORAGE_CONF": str(self.dir / "storage.conf"),
            "TMPDIR": str(self.dir / "tmp"),
            # Healthchecks are not handed to systemd (there may be none; a transient timer would
            # also run `podman healthcheck run` without this storage): see _healthchecks.
            "DISABLE_HC_SYSTEMD": "true",
        }

    def compose_env(self) -> dict[str, str]:
        """compose.yaml's variables for this cluster, and the Podman socket as DOCKER_HOST."""
        c = self.cluster
        assert c.containerd is not None, "cluster not started"
        return {
            "PATH": os.environ.get("PATH", STD_PATH),
            "HOME": str(self.dir),
            "DOCKER_HOST": f"unix://{self.sock}",
            "DOCKER_CONFIG": str(self.dir / "docker"),
            "DRANET_IMAGE": self.image,
            "NODE_NAME": c.node_name,
            "DRANET_RUN_DIR_HOST": str(self.node_dir / "run"),
            "DRANET_STORE_DIR_HOST": str(self.node_dir / "store"),
            "DRANET_INVENTORY_DIR_HOST": str(self.node_dir / "inventory"),
            "KUBELET_ROOT_DIR": str(c.kubelet_dir),
            "NRI_DIR": str(c.containerd.nri_socket.parent),
            "NETNS_DIR": NETNS_DIR,
            # attach's rshared pin bind needs a shared mount: the kubelet's root dir is one here.
            "NETNS_PIN_DIR": str(c.kubelet_dir / "dranet-netns-compose"),
            "INVENTORY_KUBECONFIG": str(self.dir / "inventory.kubeconfig"),
            "PREPARE_KUBECONFIG": str(self.dir / "prepare.kubeconfig"),
            "INVENTORY_FILTER": FILTER,
            "CLOUD_PROVIDER_HINT": "NONE",
            "INVENTORY_MIN_POLL_INTERVAL": "200ms",
            **{f"{s.upper()}_LOG_LEVEL": self.log_level for s in SERVICES},
        }

    def _write_config(self) -> None:
        from dev.image.build import _fs_type

        for d in ("storage", "runroot", "libpod", "tmp", "cni", "docker"):
            (self.dir / d).mkdir(parents=True, exist_ok=True)
        # overlay cannot stack on overlay or tmpfs (a state dir there): vfs then.
        driver = "vfs" if _fs_type(self.dir) in ("overlay", "tmpfs") else "overlay"
        (self.dir / "storage.conf").write_text(
            "[storage]\n"
            f'driver = "{driver}"\n'
            f"graphroot = {json.dumps(str(self.dir / 'storage'))}\n"
            f"runroot = {json.dumps(str(self.dir / 'runroot'))}\n"
        )
        (self.dir / "containers.conf").write_text(
            "[containers]\n"
            # Podman's default nofile/nproc (1048576) exceed the hard limits here, and without
            # CAP_SYS_RESOURCE runc's setrlimit fails: containers inherit the service's limits.
            "default_ulimits = []\n"
            "[network]\n"
            f"network_config_dir = {json.dumps(str(self.dir / 'cni'))}\n"
            "[engine]\n"
            'runtime = "runc"\n'
            'cgroup_manager = "cgroupfs"\n'
            'events_logger = "file"\n'
            'lock_type = "file"\n'
            # An exec through the API (`docker compose exec`) keeps its two conmons until this
            # delay (300 s, as Docker) has passed (Podman issue 20415), and down would find them.
            "exit_command_delay = 5\n"
            f"tmp_dir = {json.dumps(str(self.dir / 'libpod'))}\n"
            f"image_copy_tmp_dir = {json.dumps(str(self.dir / 'tmp'))}\n"
        )

    def _kubeconfig(self, service: str) -> Path:
        """``service_identity``'s kubeconfig with the CA inline: the file alone is mounted."""
        cfg = json.loads(self.cluster.service_identity(service).read_text())
        for cl in cfg["clusters"]:
            ca = Path(cl["cluster"].pop("certificate-authority"))
            cl["cluster"]["certificate-authority-data"] = base64.b64encode(ca.read_bytes()).decode()
        path = self.dir / f"{service}.kubeconfig"
        path.write_text(json.dumps(cfg, indent=2) + "\n")
        path.chmod(0o600)
        return path

    # -- commands ---------------------------------------------------------------------------------

    def podman(self, *args: str, timeout: float = 120.0, cwd: Path | None = None) -> str:
        """The podman CLI on the private storage (outside the node's namespace: no networking)."""
        res = subprocess.run(
            ["podman", *args], capture_output=True, text=True, env=self.podman_env(), timeout=timeout, cwd=cwd
        )
        if res.returncode != 0:
            raise ComposeError(f"podman {' '.join(args)}: {res.stderr.strip() or res.stdout.strip()}")
        return res.stdout

    def compose(
        self, *args: str, timeout: float = 180.0, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """``docker compose -f compose.yaml ARGS`` against the Podman service."""
        res = subprocess.run(
            [str(COMPOSE_BIN), "-f", str(COMPOSE_FILE), *args],
            capture_output=True,
            text=True,
            env=self.compose_env(),
            timeout=timeout,
        )
        if check and res.returncode != 0:
            raise ComposeError(f"docker compose {' '.join(args)}: {res.stderr.strip()[-3000:]}")
        return res

    def api(self, method: str, path: str, timeout: float = 30.0) -> Any:
        """One call to the Podman service (Docker-compatible paths, or ``/v4.0.0/libpod/...``)."""
        conn = _UnixConnection(str(self.sock), timeout)
        try:
            conn.request(method, path)
            resp = conn.getresponse()
            raw = resp.read()
        finally:
            conn.close()
        if resp.status >= 400:
            raise ComposeError(f"{method} {path}: HTTP {resp.status}: {raw[:500].decode(errors='replace')}")
        return json.loads(raw) if raw.strip().startswith((b"{", b"[")) else raw.decode(errors="replace")

    # -- state ------------------------------------------------------------------------------------

    def containers(self) -> dict[str, dict[str, Any]]:
        """The project's containers by service: their inspect documents."""
        filters = json.dumps({"label": [f"com.docker.compose.project={PROJECT}"]})
        listed = self.api("GET", f"/containers/json?all=true&filters={urllib.parse.quote(filters)}")
        out = {}
        for item in listed:
            doc = self.api("GET", f"/containers/{item['Id']}/json")
            out[doc["Config"]["Labels"]["com.docker.compose.service"]] = doc
        return out

    def health(self) -> dict[str, str]:
        """Each service's container state, and its health once it runs (``running/healthy``)."""
        out = {}
        for svc, doc in self.containers().items():
            st = doc["State"]
            health = (st.get("Health") or {}).get("Status", "")
            out[svc] = f"{st['Status']}/{health}" if health else st["Status"]
        return out

    def service_alive(self) -> bool:
        return self.service is not None and self.service.poll() is None

    # -- life cycle -------------------------------------------------------------------------------

    def up(self, timeout: float = 180.0) -> float:
        """Everything of the module docstring; returns the seconds of ``compose up`` until the four
        containers are healthy (``timings`` has the other steps)."""
        from dev.image import build as image_build

        t0 = time.monotonic()
        self._host.enter_context(image_build._host_left_alone())
        self._cgroups_before = libpod_cgroups()
        self._write_config()
        for d in ("run", "store", "inventory"):
            (self.node_dir / d).mkdir(parents=True, exist_ok=True)
        for d in ("plugins", "plugins_registry"):
            (self.cluster.kubelet_dir / d).mkdir(parents=True, exist_ok=True)
        for svc in ("inventory", "prepare"):
            self._kubeconfig(svc)
        built = image_build.build()
        self.timings["image_s"] = round(time.monotonic() - t0, 1)
        t = time.monotonic()
        self._load(built.archive, built.reference)
        self.image = built.reference
        self.timings["load_s"] = round(time.monotonic() - t, 1)
        t = time.monotonic()
        self._start_service()
        self.timings["service_s"] = round(time.monotonic() - t, 1)
        self._stop.clear()
        self._ticker = threading.Thread(target=self._healthchecks, name="compose-healthchecks", daemon=True)
        self._ticker.start()
        t = time.monotonic()
        res = self.compose(
            "up", "-d", "--wait", "--wait-timeout", str(int(timeout)), timeout=timeout + 30, check=False
        )
        if res.returncode != 0:
            raise ComposeError(f"docker compose up: {res.stderr.strip()[-3000:]}\n{self.logs()}")
        up_s = time.monotonic() - t
        self.timings["up_s"] = round(up_s, 1)
        health = self.health()
        if set(health) != set(SERVICES) or set(health.values()) != {"running/healthy"}:
            raise ComposeError(f"after compose up: {health}\n{self.logs()}")
        return up_s

    def _load(self, archive: Path, reference: str) -> None:
        """The archive's image into the private storage as ``reference``. From an OCI layout
        unpacked here: ``podman load`` (and ``pull oci-archive:``) unpack into /var/tmp whatever
        TMPDIR says; ``pull oci:`` names the image after the path as given (relative: a state
        dir such as /tmp/dnk-x_ is no valid image name), hence the retag."""
        layout = self.dir / "tmp" / "oci"
        with tarfile.open(archive) as tf:
            tf.extractall(layout, filter="data")
        image_id = self.podman("pull", "--quiet", "oci:oci", timeout=300, cwd=layout.parent).strip()
        self.podman("untag", image_id)
        self.podman("tag", image_id, reference)
        shutil.rmtree(layout)

    def _start_service(self, timeout: float = 30.0) -> None:
        log = open(self.service_log, "ab")
        try:
            self.service = subprocess.Popen(
                [
                    "nsenter", f"--net=/var/run/netns/{self.cluster.netns}",
                    "podman", "system", "service", "--time=0", f"unix://{self.sock}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.podman_env(),
                start_new_session=True,  # Ctrl-C reaches the harness, which stops it in order
            )  # fmt: skip
        finally:
            log.close()
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(OSError, ComposeError, http.client.HTTPException):
                if self.api("GET", "/_ping", timeout=2) == "OK":
                    return
            if not self.service_alive():
                raise ComposeError(f"podman system service exited:\n{self._service_log_tail()}")
            if time.monotonic() > deadline:
                raise ComposeError(f"podman system service not answering in {timeout}s")
            time.sleep(0.1)

    def _healthchecks(self) -> None:
        """Run each running container's healthcheck, as the systemd timer Podman would otherwise
        make does: every second until it is healthy, then every RECHECK_S."""
        due: dict[str, float] = {}
        while not self._stop.wait(0.5):
            try:
                listed = self.api("GET", "/containers/json", timeout=10)
            except (OSError, ComposeError, http.client.HTTPException):
                continue
            for item in listed:
                cid, now = item["Id"], time.monotonic()
                if due.get(cid, 0.0) > now or self._stop.is_set():
                    continue
                try:
                    res = self.api("GET", f"/v4.0.0/libpod/containers/{cid}/healthcheck", timeout=30)
                    due[cid] = now + (RECHECK_S if res.get("Status") == "healthy" else 1.0)
                except (OSError, ComposeError, http.client.HTTPException):
                    due[cid] = now + 1.0  # no healthcheck, stopping, or the check timed out

    def logs(self, tail: int = 60) -> str:
        if not self.service_alive():
            return f"(podman service not running)\n{self._service_log_tail()}"
        res = self.compose("logs", "--no-color", f"--tail={tail}", check=False, timeout=60)
        return res.stdout + res.stderr

    def _service_log_tail(self, n: int = 3000) -> str:
        try:
            return self.service_log.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def down(self, timeout: float = 120.0) -> None:
        """Containers removed, the service stopped, the directory and what Podman added on the host
        removed; raises ComposeError naming what was left (after removing what it could)."""
        from dev.image.build import ImageBuildError, _remove_tree

        problems = []
        # No healthcheck may start while containers stop: its conmon would wait for ever.
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(40)
        if self.service_alive():
            res = self.compose("down", "--remove-orphans", timeout=timeout, check=False)
            if res.returncode != 0:
                problems.append(f"docker compose down: {res.stderr.strip()[-2000:]}")
            with contextlib.suppress(ComposeError, OSError, http.client.HTTPException):
                if self.containers():
                    problems.append(f"containers left after compose down: {self.health()}")
        if self.dir.exists():
            # Whatever compose down left (or a service that died): the CLI on the same storage.
            with contextlib.suppress(ComposeError, subprocess.TimeoutExpired):
                self.podman("rm", "--all", "--force", "--time", "10", timeout=60)
        if self.service is not None and self.service.poll() is None:
            self.service.send_signal(signal.SIGTERM)
            try:
                self.service.wait(20)
            except subprocess.TimeoutExpired:
                self.service.kill()
                self.service.wait(10)
        deadline = time.monotonic() + 20
        while processes_naming(self.dir) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in processes_naming(self.dir):
            problems.append(f"process {pid} left: {Path(f'/proc/{pid}/cmdline').read_bytes()[:200]!r}")
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        try:
            _remove_tree(self.dir)
        except (ImageBuildError, OSError) as exc:
            problems.append(str(exc))
        for d in sorted(libpod_cgroups() - self._cgroups_before, key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                d.rmdir()
        self._host.close()
        if problems:
            raise ComposeError("; ".join(problems))

    def __enter__(self) -> Compose:
        try:
            self.up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()


# ----------------------------------------------------------------------------------------------
# python -m dev.compose up


@contextlib.contextmanager
def _signals_stop(stop: threading.Event) -> Iterator[None]:
    old = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def run(args: argparse.Namespace) -> int:
    """A cluster of its own, compose up, the demo (``--demo``), until Ctrl-C or ``--exit-after``."""
    from dev.cluster import demo
    from dev.cluster.kube import build

    def say(msg: str) -> None:
        print(f"[compose {time.strftime('%H:%M:%S')}] {msg}", flush=True)

    build()
    stop = threading.Event()
    code = 0
    with _signals_stop(stop), KubeCluster(node_name="dev-node") as c:
        c.net.add_nic("eth1", addresses=["192.168.101.2/24"], peer_addresses=["192.168.101.1/24"])
        comp = Compose(c, log_level=args.log_level)
        try:
            up_s = comp.up()
            say(f"four containers healthy {up_s:.1f}s after compose up ({comp.timings})")
            print(json.dumps({"ready": True, "health": comp.health(), "env": comp.compose_env()}), flush=True)
            if args.demo:
                t = time.monotonic()
                result = demo.run(c)
                result["demo_s"] = round(time.monotonic() - t, 1)
                print(json.dumps({"demo": result}, default=str), flush=True)
                code = 0 if result.get("ok") else 1
            deadline = time.monotonic() + args.exit_after if args.exit_after else None
            while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
                if not comp.service_alive():
                    say("podman system service exited; stopping")
                    code = 1
                    break
                stop.wait(0.5)
        except Exception as exc:
            print(f"[compose] failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            code = 1
        finally:
            # The Pod goes while attach runs, so StopPodSandbox gives the NIC back.
            c.delete_pods(namespaces_except=("kube-system",))
            print(json.dumps({"stopped": True, "eth1_on_node": c.net.has_link("eth1")}), flush=True)
            comp.down()
            say("down")
    return code


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dev.compose", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    u = sub.add_parser("up", help="a cluster, compose.yaml on it through Podman, until Ctrl-C")
    u.add_argument("--log-level", default="INFO", help="the four services' log level")
    u.add_argument("--demo", action="store_true", help="run the demo Pod with eth1 once healthy")
    u.add_argument("--exit-after", type=float, default=0.0, help="stop after this many seconds; 0: Ctrl-C")
    args = p.parse_args(argv)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
