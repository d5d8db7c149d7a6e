"""Unix socket files and their directories, as the four services make them.

The services run as real processes with umask 000, so the modes checked are the ones
the code sets, not ones a kind umask happens to give: every gRPC socket is 0600 and
owned by the service's uid (the chart runs all four as uid 0), and every directory a
service creates on the way to a socket is not world-writable (whoever can write it can
replace the socket). The store's database files are private too."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from dev.cluster.procs import ServiceProcess
from tests.integration.store.test_store_process import store_proc

pytestmark = [pytest.mark.root, pytest.mark.slow]

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
"""


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    """Children started inside inherit ``mask``."""
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def assert_private_socket(path: Path) -> None:
    st = path.lstat()
    assert stat.S_ISSOCK(st.st_mode), f"{path} is not a socket"
    mode = stat.S_IMODE(st.st_mode)
    assert mode == 0o600, f"{path} has mode {mode:04o}, want 0600"
    assert st.st_uid == os.geteuid(), f"{path} is owned by uid {st.st_uid}, not the service's {os.geteuid()}"


def assert_not_world_writable(path: Path) -> None:
    mode = stat.S_IMODE(path.stat().st_mode)
    assert not mode & stat.S_IWOTH, f"{path} has mode {mode:04o}: anyone could replace its sockets"
    assert not mode & stat.S_IWGRP, f"{path} has mode {mode:04o}: its group could replace its sockets"


def test_store_socket_and_files_are_private(tmp_path: Path) -> None:
    with umask(0), store_proc(tmp_path) as proc:
        sock = Path(proc.socket)
        assert_private_socket(sock)
        assert_not_world_writable(sock.parent)  # the run dir, made by the store
        db = tmp_path / "db"
        assert stat.S_IMODE(db.stat().st_mode) == 0o700
        for name in ("data.mdb", "lock.mdb", "owner.lock"):
            mode = stat.S_IMODE((db / name).stat().st_mode)
            assert mode == 0o600, f"{name} has mode {mode:04o}"


@pytest.fixture
def pod() -> Iterator[tuple[Path, dict[str, ServiceProcess]]]:
    """The four services in one run dir (made by them), as in the pod; inventory without
    an API server (--no-publish), prepare with a kubeconfig it never uses and a kubelet
    root of its own, attach with no NRI socket."""
    d = Path(tempfile.mkdtemp(prefix="sm-"))  # short: socket paths stay under 108 bytes
    (d / "kubeconfig").write_text(KUBECONFIG)
    run = d / "run"
    procs: dict[str, ServiceProcess] = {}

    def start(service: str, *args: str) -> None:
        p = ServiceProcess(
            f"services.{service}",
            ["--run-dir", str(run), "--health-port", "0", *args],
            socket=run / f"{service}.sock",
            log_path=d / f"{service}.log",
        )
        procs[service] = p
        p.start(timeout=60)

    try:
        with umask(0):
            start("store", "--db-dir", str(d / "db"))
            start(
                "inventory",
                "--no-publish",
                "--node-name",
                "n",
                "--cloud-provider-hint",
                "NONE",
                "--metrics-port",
                "0",
            )
            start(
                "prepare",
                "--kubeconfig",
                str(d / "kubeconfig"),
                "--kubelet-root-dir",
                str(d / "kubelet"),
                "--node-name",
                "n",
            )
            start("attach", "--nri-socket", str(d / "no-nri" / "nri.sock"), "--drain-timeout", "1")
        yield d, procs
    finally:
        for p in reversed(procs.values()):
            with contextlib.suppress(Exception):
                p.stop()
        shutil.rmtree(d, ignore_errors=True)


def test_every_service_socket_is_0600_in_a_directory_only_root_writes(
    pod: tuple[Path, dict[str, ServiceProcess]],
) -> None:
    d, _ = pod
    sockets = [d / "run" / f"{s}.sock" for s in ("store", "inventory", "prepare", "attach")]
    # prepare's kubelet plugin sockets: the DRA service and the registration.
    sockets += [
        d / "kubelet" / "plugins" / "dra.net" / "dra.sock",
        d / "kubelet" / "plugins_registry" / "dra.net-reg.sock",
    ]
    for sock in sockets:
        assert_private_socket(sock)
    for directory in {s.parent for s in sockets} | {d / "kubelet" / "plugins", d / "kubelet"}:
        assert_not_world_writable(directory)
