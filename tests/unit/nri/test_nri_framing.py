"""ttrpc and NRI mux framing: header layout, splitting and reassembly."""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.attach.nri import mux, ttrpc
from services.attach.nri.ttrpc import Frame, FrameDecoder, Header, MessageType


@pytest.mark.parametrize(
    ("header", "wire"),
    [
        (Header(0, 1, MessageType.REQUEST, 0), "00000000000000010100"),
        (Header(5, 3, MessageType.RESPONSE, 0), "00000005000000030200"),
        (Header(4 << 20, 0xFFFFFFFF, MessageType.DATA, 0x05), "00400000ffffffff0305"),
        (Header(0x01020304, 0x0A0B0C0D, 0x02, 0x02), "010203040a0b0c0d0202"),
    ],
)
def test_ttrpc_header_layout(header: Header, wire: str) -> None:
    assert header.encode().hex() == wire
    assert Header.decode(bytes.fromhex(wire)) == header


def test_ttrpc_constants_match_upstream() -> None:
    assert ttrpc.HEADER_LEN == 10
    assert ttrpc.MAX_MESSAGE_LEN == 4194304
    assert (MessageType.REQUEST, MessageType.RESPONSE, MessageType.DATA) == (1, 2, 3)
    assert (ttrpc.Flag.REMOTE_CLOSED, ttrpc.Flag.REMOTE_OPEN, ttrpc.Flag.NO_DATA) == (1, 2, 4)
    assert ttrpc.Code.UNIMPLEMENTED == 12 and ttrpc.Code.RESOURCE_EXHAUSTED == 8


def test_ttrpc_header_too_short() -> None:
    with pytest.raises(ttrpc.ProtocolError, match="10 bytes"):
        Header.decode(b"\x00" * 9)


@pytest.mark.parametrize(
    ("stream_id", "payload", "error"),
    [
        (1, b"x" * (ttrpc.MAX_MESSAGE_LEN + 1), "exceeds the 4194304-byte limit"),
        (0, b"", "stream id 0"),
        (1 << 32, b"", "out of range"),
    ],
)
def test_encode_message_refuses(stream_id: int, payload: bytes, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        ttrpc.encode_message(stream_id, MessageType.REQUEST, payload)


def test_encode_message_at_limit() -> None:
    msg = ttrpc.encode_message(7, MessageType.RESPONSE, b"\x01" * ttrpc.MAX_MESSAGE_LEN)
    assert len(msg) == ttrpc.HEADER_LEN + ttrpc.MAX_MESSAGE_LEN
    assert msg[:10].hex() == "00400000000000070200"


def _chunks(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


messages = st.lists(
    st.tuples(
        st.integers(1, 0xFFFFFFFF),
        st.sampled_from([MessageType.REQUEST, MessageType.RESPONSE]),
        st.binary(max_size=300),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=200, deadline=None)
@given(messages, st.lists(st.integers(0, 10_000), max_size=40))
def test_ttrpc_reassembly_across_any_chunking(msgs: list[tuple[int, int, bytes]], cuts: list[int]) -> None:
    stream = b"".join(ttrpc.encode_message(sid, t, p) for sid, t, p in msgs)
    dec = FrameDecoder()
    got: list[Frame] = []
    for chunk in _chunks(stream, cuts):
        got.extend(dec.feed(chunk))
    assert [(f.stream_id, f.type, f.payload) for f in got] == msgs
    assert dec.buffered == 0


@pytest.mark.parametrize(
    ("limit", "chunk"),
    [
        (50, 1),
        (50, 7),
        (50, 10),
        (50, 11),
        (50, 61),
        (ttrpc.MAX_MESSAGE_LEN, 4096),
        (ttrpc.MAX_MESSAGE_LEN, 1 << 20),
    ],
)
def test_oversized_message_is_reported_and_skipped(limit: int, chunk: int) -> None:
    """A message above the limit is reported once (so the server can answer
    RESOURCE_EXHAUSTED on its stream) and its bytes are skipped, never
    buffered; the next message on the stream is decoded normally."""
    big = struct.pack(">IIBB", limit + 1, 9, MessageType.REQUEST, 0) + b"\xee" * (limit + 1)
    stream = big + ttrpc.encode_message(11, MessageType.REQUEST, b"next")
    dec = FrameDecoder(max_len=limit)
    got: list[Frame] = []
    for i in range(0, len(stream), chunk):
        got.extend(dec.feed(stream[i : i + chunk]))
        assert dec.buffered <= chunk + ttrpc.HEADER_LEN + len(b"next")
    assert [(f.stream_id, f.oversized, f.payload) for f in got] == [(9, True, b""), (11, False, b"next")]
    assert dec.buffered == 0


# -- mux -------------------------------------------------------------------------------------


def _mux_payloads(data: bytes) -> list[tuple[int, int]]:
    """(conn id, payload length) of each mux frame in ``data``, parsed independently."""
    out = []
    pos = 0
    while pos < len(data):
        cid, n = struct.unpack_from(">II", data, pos)
        out.append((cid, n))
        pos += 8 + n
    assert pos == len(data)
    return out


@pytest.mark.parametrize(
    ("payload_len", "frame_lens"),
    [
        (0, [10]),
        (1, [11]),
        (4085, [4095]),
        (4086, [4096]),
        (4087, [4096, 1]),
        (8182, [4096, 4096]),
        (8183, [4096, 4097]),
        (100_000, [4096, 95914]),
        (4 << 20, [4096, (4 << 20) - 4086]),
    ],
)
def test_mux_write_rule_splits_after_4086_payload_bytes(payload_len: int, frame_lens: list[int]) -> None:
    msg = ttrpc.encode_message(
        1, MessageType.RESPONSE, bytes(range(256)) * (payload_len // 256) + b"\x07" * (payload_len % 256)
    )
    frames = mux.frames_for_message(2, msg)
    assert [len(f) - 8 for f in frames] == frame_lens
    wire = b"".join(frames)
    assert _mux_payloads(wire) == [(2, n) for n in frame_lens]
    # The frames carry the message unchanged, and frame 1 starts with its ttrpc header.
    assert b"".join(f[8:] for f in frames) == msg
    assert frames[0][8:18] == msg[:10]


def test_mux_refuses_empty_and_huge_frames() -> None:
    with pytest.raises(ValueError, match="empty"):
        mux.frame(1, b"")
    with pytest.raises(ValueError, match="not a ttrpc message"):
        mux.frames_for_message(1, b"short")


def test_mux_constants() -> None:
    assert (mux.PLUGIN_SERVICE_CONN, mux.RUNTIME_SERVICE_CONN) == (1, 2)
    assert mux.FIRST_FRAME_PAYLOAD == 4086
    assert mux.frame(0x01020304, b"ab").hex() == "01020304000000026162"


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 5), st.binary(min_size=1, max_size=200)), min_size=1, max_size=10),
    st.lists(st.integers(0, 5000), max_size=30),
)
def test_mux_reassembly_across_any_chunking(frames: list[tuple[int, bytes]], cuts: list[int]) -> None:
    wire = b"".join(mux.frame(c, p) for c, p in frames)
    dec = mux.MuxDecoder()
    got: list[tuple[int, bytes]] = []
    for chunk in _chunks(wire, cuts):
        got.extend(dec.feed(chunk))
    assert got == frames
    assert dec.buffered == 0


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.binary(max_size=9000), min_size=1, max_size=5),
    st.lists(st.integers(1, 9000), min_size=1, max_size=20),
)
def test_ttrpc_stream_split_over_mux_frames_anywhere(payloads: list[bytes], sizes: list[int]) -> None:
    """A peer may cut a conn's byte stream into mux frames anywhere: readers must
    treat each conn id as a byte stream, never one frame as one message."""
    stream = b"".join(ttrpc.encode_message(2 * i + 1, MessageType.REQUEST, p) for i, p in enumerate(payloads))
    wire = bytearray()
    pos, k = 0, 0
    while pos < len(stream):
        n = sizes[k % len(sizes)]
        wire += mux.frame(1, stream[pos : pos + n])
        wire += mux.frame(5, b"noise")  # unknown conn ids are interleaved and ignored
        pos += n
        k += 1
    dm, dec = mux.MuxDecoder(), FrameDecoder()
    got: list[bytes] = []
    for cid, payload in dm.feed(bytes(wire)):
        if cid == 1:
            got.extend(f.payload for f in dec.feed(payload))
    assert got == payloads


def test_mux_frame_longer_than_any_peer_writes_is_a_protocol_error() -> None:
    dec = mux.MuxDecoder()
    with pytest.raises(ttrpc.ProtocolError, match="exceeds"):
        dec.feed(struct.pack(">II", 1, mux.MAX_FRAME_LEN + 1))
