"""Who may talk to the store.

The store does not read its peers' credentials: gRPC cannot give them to it. Over a
Unix socket grpc-python's ``context.peer()`` is just ``"unix:"`` and the auth context
holds only ``transport_security_type: insecure`` (or ``local`` with local
credentials, which check nothing either: grpc/grpc#15511, grpc/grpc#28755), and
grpc-python has no hook on accept where SO_PEERCRED could be read. So the kernel
enforces it at connect(): the socket is 0600 and owned by the store's uid (uid 0 in
the pod), so only that uid, or a process holding CAP_DAC_OVERRIDE, can connect.

Checked with real processes: a client of another uid (setpriv to 65534) is refused
although it can reach a world-connectable socket in the same directory; a client of
the store's uid with every capability dropped (as prepare and the other containers
run: uid 0 without CAP_DAC_OVERRIDE) is served; so is root."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from dev.cluster.procs import ServiceProcess
from tests.integration.store.test_store_process import store_proc

pytestmark = [pytest.mark.root]

REPO = Path(__file__).resolve().parents[2]
NOBODY = 65534

CLIENT = textwrap.dedent(
    """
    import errno, json, socket, sys
    out = {"uid": __import__("os").getuid()}
    for line in open("/proc/self/status"):
        if line.startswith("CapEff:"):
            out["cap_eff"] = int(line.split()[1], 16)
    for name, path in (("store", sys.argv[1]), ("open", sys.argv[2])):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(path)
            out[name] = "connected"
        except OSError as e:
            out[name] = errno.errorcode[e.errno]
        finally:
            s.close()
    import grpc
    from proto.dranet.store.v1 import store_pb2, store_pb2_grpc
    with grpc.insecure_channel("unix:" + sys.argv[1]) as ch:
        try:
            store_pb2_grpc.PodConfigStoreStub(ch).GetLiveness(store_pb2.GetLivenessRequest(), timeout=3)
            out["grpc"] = "OK"
        except grpc.RpcError as e:
            out["grpc"] = e.code().name
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def store() -> Iterator[tuple[ServiceProcess, str]]:
    # A directory everyone may traverse, so that only the socket's own mode decides.
    d = Path(tempfile.mkdtemp(prefix="peer-"))
    d.chmod(0o755)
    proc = store_proc(d)
    # A world-connectable socket beside the store's: proves the other uid reaches the directory.
    open_path = str(d / "run" / "open.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        proc.start()
        listener.bind(open_path)
        os.chmod(open_path, 0o666)
        listener.listen(4)
        yield proc, open_path
    finally:
        listener.close()
        proc.stop()
        shutil.rmtree(d, ignore_errors=True)


def client(store: tuple[ServiceProcess, str], *setpriv: str) -> dict[str, object]:
    proc, open_path = store
    cmd = [sys.executable, "-c", CLIENT, proc.socket, open_path]
    if setpriv:
        cmd = ["setpriv", *setpriv, "--", *cmd]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_a_client_of_another_uid_is_refused(store: tuple[ServiceProcess, str]) -> None:
    got = client(store, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups")
    assert got["uid"] == NOBODY
    assert got["open"] == "connected", (
        "the other uid must reach the run directory for this test to mean anything"
    )
    assert got["store"] == "EACCES"
    assert got["grpc"] == "UNAVAILABLE"


def test_the_stores_uid_without_any_capability_is_served(store: tuple[ServiceProcess, str]) -> None:
    # As the chart runs the other containers: uid 0, no CAP_DAC_OVERRIDE.
    got = client(store, "--bounding-set=-all", "--inh-caps=-all", "--ambient-caps=-all")
    assert got["uid"] == 0 and got["cap_eff"] == 0, got
    assert got["store"] == "connected" and got["grpc"] == "OK"


def test_root_is_served(store: tuple[ServiceProcess, str]) -> None:
    got = client(store)
    assert got["store"] == "connected" and got["grpc"] == "OK"
