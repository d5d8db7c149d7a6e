"""A real store process (``python -m services.store`` on a real LMDB directory) fed
generated requests over its gRPC socket, unary and in a Session, and raw bytes that are
no gRPC at all.

Property: every call ends OK or with an error status whose message names the field
(NOT_FOUND names the pod and device); the process stays up; the records written before
the fuzzing are unchanged; and after a SIGKILL and a restart the store lists exactly
what it listed before."""

from __future__ import annotations

import hashlib
import shutil
import socket
import struct
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proto.dranet.store.v1 import store_pb2 as pb
from proto.dranet.store.v1 import store_pb2_grpc
from shared.rpc import sync_channel
from tests.integration.store.test_store_process import make_config, store_proc

pytestmark = [pytest.mark.slow]

SEEDS = [
    make_config(f"seed-pod-{i}", f"seed-eth{j}", claim=f"seed-claim-{i}") for i in range(3) for j in range(2)
]
FIELD_NAMES = ("pod_uid", "device", "claim_uid", "claim.uid", "configs[")
SETTINGS = settings(
    deadline=None,  # each call has its own gRPC deadline
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)

# -- generated messages ------------------------------------------------------------------------

odd = st.one_of(
    st.sampled_from(
        ["", "../", "../../etc/passwd", "/", "a/b", "\x00", "a\x00b", ".", "..", "x\n", "é", "👍", "\u202e"]
    ),
    st.sampled_from([253, 254, 300]).map(lambda n: "p" * n),  # around the 253-byte key limit
    st.just("é" * 127),  # 254 bytes in 127 characters
    st.text(max_size=30),
).filter(lambda s: not s.startswith("seed-"))
# Key parts: mostly from a small pool, so that writes succeed and later calls hit them;
# some of the pool is valid but odd (the store takes any name without '/' or NUL).
POOL = ["p1", "p2", "eth0", "eth1", "c1", "c2", "..", ".", "é👍", "x\n", "a b", "q" * 253]
keys = st.one_of(st.sampled_from(POOL), st.sampled_from(POOL), odd)
any_text = st.one_of(odd, st.text(max_size=2000), st.just("x" * 300_000))
ints = st.one_of(st.integers(-(2**63), 2**63 - 1), st.sampled_from([0, -1, 2**63 - 1, -(2**63)]))

pod_refs = st.builds(pb.PodRef, uid=keys, namespace=odd, name=odd)
claim_refs = st.builds(pb.ClaimRef, uid=keys, namespace=odd, name=odd)
linux_devices = st.builds(
    pb.LinuxDevice,
    path=odd,
    type=odd,
    major=ints,
    minor=ints,
    file_mode=st.integers(0, 2**32 - 1),
    uid=st.integers(0, 2**32 - 1),
    gid=st.integers(0, 2**32 - 1),
)
device_configs = st.builds(
    pb.DeviceConfig,
    pod=pod_refs,
    device=keys,
    claim=claim_refs,
    request=odd,
    driver=odd,
    pool=odd,
    host_ifname=odd,
    pod_config_json=any_text,
    host_config_json=any_text,
    rdma=st.builds(pb.RdmaConfig, link_dev=odd, dev_chars=st.lists(linux_devices, max_size=3)),
    profile=odd,
    rdma_netns_mode=odd,
    prepared_unix_nano=ints,
    provisional=st.booleans(),
    revision=ints,
)
attach_results = st.builds(
    pb.AttachResult,
    pod_uid=keys,
    device=keys,
    claim=claim_refs,
    interface_name=odd,
    ips=st.lists(odd, max_size=3),
    hardware_address=odd,
    conditions=st.lists(
        st.builds(pb.Condition, type=odd, status=odd, reason=odd, message=any_text), max_size=2
    ),
    attached=st.booleans(),
    error=any_text,
    updated_unix_nano=ints,
    host_ifname=odd,
    revision=ints,
)
device_keys = st.builds(pb.DeviceKey, pod_uid=keys, device=keys)
pod_keys = st.builds(pb.PodKey, pod_uid=keys)
claim_keys = st.builds(pb.ClaimKey, claim_uid=keys)
activities = st.builds(pb.PodActivity, pod_uid=keys, last_nri_activity_unix_nano=ints, revision=ints)

# (method, request): every unary call of the service.
unary_calls = st.one_of(
    st.tuples(
        st.just("PutDevices"), st.builds(pb.PutDevicesRequest, configs=st.lists(device_configs, max_size=3))
    ),
    st.tuples(st.just("GetDevice"), device_keys),
    st.tuples(st.just("DeleteDevice"), device_keys),
    st.tuples(st.just("GetPod"), pod_keys),
    st.tuples(st.just("DeletePod"), pod_keys),
    st.tuples(st.just("ClearAttachState"), pod_keys),
    st.tuples(st.just("DeleteClaim"), claim_keys),
    st.tuples(st.just("List"), st.builds(pb.ListRequest, pod_uid=keys, claim_uid=keys)),
    st.tuples(st.just("PutAttachResult"), attach_results),
    st.tuples(st.just("TouchPod"), activities),
    st.tuples(st.just("GetLiveness"), st.just(pb.GetLivenessRequest())),
)


@st.composite
def session_requests(draw: st.DrawFn) -> pb.SessionRequest:
    req = pb.SessionRequest(id=draw(st.integers(0, 2**64 - 1)))
    op = draw(
        st.sampled_from(
            ["put_devices", "get_device", "delete_device", "get_pod", "delete_pod", "delete_claim", "list",
             "put_attach_result", "touch_pod", "get_liveness", "clear_attach_state", None]
        )
    )  # fmt: skip
    values = {
        "put_devices": st.builds(pb.PutDevicesRequest, configs=st.lists(device_configs, max_size=2)),
        "get_device": device_keys,
        "delete_device": device_keys,
        "get_pod": pod_keys,
        "delete_pod": pod_keys,
        "delete_claim": claim_keys,
        "list": st.builds(pb.ListRequest, pod_uid=keys, claim_uid=keys),
        "put_attach_result": attach_results,
        "touch_pod": activities,
        "get_liveness": st.just(pb.GetLivenessRequest()),
        "clear_attach_state": pod_keys,
    }
    if op is not None:  # None: no op at all, which the store must refuse, not crash on
        getattr(req, op).CopyFrom(draw(values[op]))
    return req


def _names_field(code: grpc.StatusCode, message: str, request: object) -> None:
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        assert any(f in message for f in FIELD_NAMES), f"INVALID_ARGUMENT names no field: {message!r}"
    elif code == grpc.StatusCode.NOT_FOUND:
        assert message.startswith("no device config for pod"), message
    elif code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        # gRPC's own limit (16 MiB messages) or the LMDB map's --max-map-size.
        assert "message" in message.lower() or "map" in message, message
    else:
        raise AssertionError(f"{code.name} for {type(request).__name__}: {message!r}")


# -- the process -----------------------------------------------------------------------------


class Store:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="stf-"))  # short: socket paths stay under 108 bytes
        self.proc = store_proc(self.dir)
        self.channel: grpc.Channel | None = None

    def start(self) -> None:
        self.proc.start()
        self.channel = sync_channel(self.proc.socket)
        self.stub = store_pb2_grpc.PodConfigStoreStub(self.channel)

    def kill(self) -> None:
        if self.channel is not None:
            self.channel.close()
        self.proc.kill()

    def alive(self) -> None:
        assert self.proc.proc is not None and self.proc.proc.poll() is None, (
            f"the store died:\n{self.proc.log()}"
        )


@pytest.fixture(scope="module")
def store() -> Iterator[Store]:
    s = Store()
    try:
        s.start()
        s.stub.PutDevices(pb.PutDevicesRequest(configs=SEEDS), timeout=10)
        yield s
    finally:
        s.kill()
        shutil.rmtree(s.dir, ignore_errors=True)


def seeds_intact(store: Store) -> None:
    for seed in SEEDS:
        got = store.stub.GetDevice(pb.DeviceKey(pod_uid=seed.pod.uid, device=seed.device), timeout=5)
        assert got.pod_config_json == seed.pod_config_json
        assert got.profile == hashlib.sha256(got.pod_config_json.encode()).hexdigest(), (
            "a seed record changed"
        )


@settings(SETTINGS, max_examples=300)
@given(unary_calls)
def test_every_unary_call_is_ok_or_names_the_field(store: Store, call: tuple[str, object]) -> None:
    method, request = call
    try:
        getattr(store.stub, method)(request, timeout=10)
    except grpc.RpcError as err:
        _names_field(err.code(), err.details() or "", request)
    store.alive()


@settings(SETTINGS, max_examples=60)
@given(st.lists(session_requests(), min_size=1, max_size=8))
def test_every_session_request_gets_its_answer(store: Store, requests: list[pb.SessionRequest]) -> None:
    answers = list(store.stub.Session(iter(requests), timeout=20))
    # Responses may come out of order; each request gets exactly one.
    assert sorted(a.id for a in answers) == sorted(r.id for r in requests)
    for a in answers:
        if a.code == grpc.StatusCode.UNIMPLEMENTED.value[0]:
            assert "session op None is not known" in a.message, a.message
        elif a.code:
            _names_field(grpc.StatusCode(_CODES[a.code]), a.message, a)
    store.alive()


_CODES = {c.value[0]: c.value for c in grpc.StatusCode}


# -- bytes that are no gRPC --------------------------------------------------------------------

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def h2_frame(kind: int, flags: int, stream: int, payload: bytes, length: int | None = None) -> bytes:
    n = len(payload) if length is None else length
    return struct.pack(">I", n)[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


h2_frames = st.builds(
    h2_frame,
    st.integers(0, 255),  # frame type: DATA, HEADERS, SETTINGS, ... and unknown
    st.integers(0, 255),
    st.one_of(st.integers(0, 9), st.just(2**31 - 1)),
    st.binary(max_size=64),
    st.one_of(st.none(), st.integers(0, 2**24 - 1)),
)
raw_streams = st.one_of(
    st.binary(max_size=512),
    st.lists(h2_frames, max_size=6).map(lambda fs: PREFACE + b"".join(fs)),
    st.just(PREFACE + h2_frame(4, 0, 0, b"") + h2_frame(1, 4, 1, b"\x82\x86" + b"\xff" * 40)),
    st.just(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
)


@settings(SETTINGS, max_examples=60)
@given(raw_streams, st.booleans())
def test_raw_bytes_on_the_socket_do_no_harm(store: Store, data: bytes, half_close: bool) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(store.proc.socket)
        try:
            s.sendall(data)
            if half_close:
                s.shutdown(socket.SHUT_WR)
            s.recv(65536)  # whatever the server answers (a GOAWAY), or nothing
        except (TimeoutError, ConnectionError):
            pass
    store.alive()
    store.stub.GetLiveness(pb.GetLivenessRequest(), timeout=5)


# Well-framed gRPC whose body is no valid message: undecodable wire bytes, and a proto3
# string that is not UTF-8 (protobuf refuses to parse it).
BAD_BODIES = [
    b"\xff\xff\xff",
    b"\x0a\x05\x80",  # a length-delimited field cut short
    b"\x0a\x03\xff\xfe\xfd",  # DeviceKey.pod_uid / PutDevicesRequest.configs[0] = invalid UTF-8 / bytes
    b"\x0a" + b"\x0a\x80" * 200,  # nesting past the decoder's limit
]


@pytest.mark.parametrize("body", BAD_BODIES, ids=range(len(BAD_BODIES)))
@pytest.mark.parametrize("method", ["GetDevice", "PutDevices", "DeleteClaim"])
def test_undecodable_messages_are_refused(store: Store, method: str, body: bytes) -> None:
    """grpc-python itself answers a request it cannot deserialize, before the store sees
    it: UNKNOWN, naming the message type and the decode error (and it logs the error
    with a traceback). The store stays up and nothing is written."""
    assert store.channel is not None
    before = store.stub.List(pb.ListRequest(), timeout=5).revision
    raw = store.channel.unary_unary(f"/dranet.store.v1.PodConfigStore/{method}")
    with pytest.raises(grpc.RpcError) as err:
        raw(body, timeout=5)
    assert err.value.code() == grpc.StatusCode.UNKNOWN, err.value
    assert "Error parsing message with type 'dranet.store.v1." in (err.value.details() or "")
    store.alive()
    assert store.stub.List(pb.ListRequest(), timeout=5).revision == before


def test_a_message_above_the_limit_is_refused(store: Store) -> None:
    big = pb.PutDevicesRequest(configs=[make_config("big-pod", "eth0", payload="x" * (17 << 20))])
    with pytest.raises(grpc.RpcError) as err:
        store.stub.PutDevices(big, timeout=30)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    store.alive()


# -- last: what was written survives, and a restart reloads all of it -----------------------


def test_z_seeds_intact_and_a_restart_reloads_everything(store: Store) -> None:
    seeds_intact(store)
    before = store.stub.List(pb.ListRequest(), timeout=10)
    assert len(before.devices) >= len(SEEDS)
    store.kill()  # SIGKILL: no clean shutdown
    time.sleep(0.1)
    store.start()
    after = store.stub.List(pb.ListRequest(), timeout=10)
    assert after == before
    seeds_intact(store)
