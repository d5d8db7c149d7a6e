"""The shared netlink socket's request loop (shared/rtnl/sock.py) over a fake socket
that answers with scripted datagrams: which replies belong to the request, where a
request ends, errors, and bytes that cannot be framed (an error, never a hang)."""

from __future__ import annotations

import errno
import struct
from collections.abc import Iterator

import pytest

from shared.rtnl import codec
from shared.rtnl.codec import MalformedError, NetlinkError
from shared.rtnl.sock import MAX_DUMP_ATTEMPTS, NetlinkSocket


class FakeSock:
    """Records what was sent; answers each send with the next scripted datagrams.
    Reading past the script fails the test instead of blocking."""

    def __init__(self, replies: list[list[bytes]]) -> None:
        self.sent: list[bytes] = []
        self.replies = replies
        self.pending: Iterator[bytes] = iter(())

    def send(self, data: bytes) -> int:
        self.sent.append(data)
        self.pending = iter(self.replies.pop(0))
        return len(data)

    def recv_into(self, buf: bytearray, nbytes: int = 0, flags: int = 0) -> int:
        data = next(self.pending, None)
        if data is None:
            raise AssertionError("the request loop read past its replies")
        n = min(len(data), len(buf))
        buf[:n] = data[:n]
        return len(data)  # MSG_TRUNC: the real length

    def close(self) -> None:
        pass


def scripted(*replies: list[bytes], bufsize: int = 1 << 16) -> tuple[NetlinkSocket, FakeSock]:
    s = NetlinkSocket.__new__(NetlinkSocket)
    fake = FakeSock(list(replies))
    s.sock = fake  # type: ignore[assignment]
    s.proto = codec.NETLINK_ROUTE
    s._seq = 0
    s._buf = bytearray(bufsize)
    return s, fake


def msg(mtype: int, body: bytes, seq: int, flags: int = 0) -> bytes:
    data = codec.message(mtype, flags, seq, body)
    return data + b"\0" * (-len(data) % 4)


def link(seq: int, index: int, flags: int = codec.NLM_F_MULTI) -> bytes:
    return msg(codec.RTM_NEWLINK, codec.IFINFOMSG.pack(0, 1, index, 0, 0), seq, flags)


def done(seq: int, code: int = 0, flags: int = codec.NLM_F_MULTI) -> bytes:
    return msg(codec.NLMSG_DONE, struct.pack("=i", -code), seq, flags)


def ack(seq: int, code: int = 0) -> bytes:
    return msg(
        codec.NLMSG_ERROR, struct.pack("=i", -code) + codec.NLMSGHDR.pack(16, 0, 0, seq, 0), seq, 0x100
    )


def indexes(replies: Iterator[tuple[int, int, memoryview]]) -> list[tuple[int, int]]:
    return [(t, codec.IFINFOMSG.unpack_from(b)[2] if t == codec.RTM_NEWLINK else -1) for t, _f, b in replies]


DUMP = codec.NLM_F_REQUEST | codec.NLM_F_DUMP


def test_a_dump_runs_over_datagrams_until_done_skipping_other_sequence_numbers() -> None:
    s, fake = scripted([ack(7) + link(1, 1), link(3, 9) + link(1, 2), done(1)])
    assert indexes(s.messages(codec.RTM_GETLINK, DUMP, b"")) == [
        (codec.RTM_NEWLINK, 1),
        (codec.RTM_NEWLINK, 2),
    ]
    length, mtype, flags, seq, _pid = codec.NLMSGHDR.unpack_from(fake.sent[0])
    assert (length, mtype, flags, seq) == (16, codec.RTM_GETLINK, DUMP, 1)


def test_a_get_without_ack_ends_at_its_answer_and_with_ack_at_the_ack() -> None:
    s, _ = scripted([link(1, 4, flags=0)], [link(2, 4, flags=0), ack(2)])
    assert indexes(s.messages(codec.RTM_GETLINK, codec.NLM_F_REQUEST, b"")) == [(codec.RTM_NEWLINK, 4)]
    got = s.messages(codec.RTM_GETLINK, codec.NLM_F_REQUEST | codec.NLM_F_ACK, b"")
    assert indexes(got) == [(codec.RTM_NEWLINK, 4)]


def test_the_done_of_an_interrupted_dump_is_yielded() -> None:
    s, _ = scripted(
        [
            link(1, 1, codec.NLM_F_MULTI | codec.NLM_F_DUMP_INTR),
            done(1, flags=codec.NLM_F_MULTI | codec.NLM_F_DUMP_INTR),
        ]
    )
    got = [(t, f & codec.NLM_F_DUMP_INTR) for t, f, _b in s.messages(codec.RTM_GETLINK, DUMP, b"")]
    assert got == [(codec.RTM_NEWLINK, codec.NLM_F_DUMP_INTR), (codec.NLMSG_DONE, codec.NLM_F_DUMP_INTR)]


@pytest.mark.parametrize(
    ("datagram", "code"),
    [
        (ack(1, errno.EPERM), errno.EPERM),
        (link(1, 1) + done(1, errno.EMSGSIZE), errno.EMSGSIZE),  # a dump that failed part way
    ],
)
def test_kernel_errors_raise(datagram: bytes, code: int) -> None:
    s, _ = scripted([datagram])
    with pytest.raises(NetlinkError) as err:
        list(s.messages(codec.RTM_GETLINK, DUMP, b""))
    assert err.value.errno == code


def test_a_datagram_bigger_than_the_buffer_is_an_error_not_a_cut() -> None:
    s, _ = scripted([link(1, 1) * 8], bufsize=64)
    with pytest.raises(NetlinkError, match="reply of 256 bytes does not fit") as err:
        list(s.messages(codec.RTM_GETLINK, DUMP, b""))
    assert err.value.errno == errno.EMSGSIZE


@pytest.mark.parametrize(
    "datagram",
    [
        codec.NLMSGHDR.pack(0, codec.RTM_NEWLINK, 0, 1, 0),  # zero length: would never advance
        codec.NLMSGHDR.pack(400, codec.RTM_NEWLINK, codec.NLM_F_MULTI, 1, 0) + bytes(16),
        link(1, 1) + b"\0" * 6,
    ],
)
def test_a_datagram_that_cannot_be_framed_raises_instead_of_waiting(datagram: bytes) -> None:
    s, _ = scripted([datagram])
    with pytest.raises(MalformedError):
        list(s.messages(codec.RTM_GETLINK, DUMP, b""))


def test_sequence_numbers_increase_per_request() -> None:
    s, fake = scripted([ack(1)], [ack(2)])
    list(s.messages(codec.RTM_NEWLINK, codec.NLM_F_REQUEST | codec.NLM_F_ACK, b""))
    list(s.messages(codec.RTM_NEWLINK, codec.NLM_F_REQUEST | codec.NLM_F_ACK, b""))
    assert [codec.NLMSGHDR.unpack_from(d)[3] for d in fake.sent] == [1, 2]


def decode_index(mtype: int, body: memoryview) -> int | None:
    return codec.IFINFOMSG.unpack_from(body)[2] if mtype == codec.RTM_NEWLINK else None


def test_dump_retries_an_interrupted_dump_then_uses_the_last_result() -> None:
    intr = codec.NLM_F_MULTI | codec.NLM_F_DUMP_INTR
    s, _ = scripted([link(1, 1, intr) + done(1)], [link(2, 1) + link(2, 2) + done(2)])
    assert s.dump(codec.RTM_GETLINK, b"", decode_index) == [1, 2]
    s, fake = scripted(*[[link(i, 5, intr) + done(i, flags=intr)] for i in range(1, MAX_DUMP_ATTEMPTS + 1)])
    assert s.dump(codec.RTM_GETLINK, b"", decode_index) == [5]
    assert len(fake.sent) == MAX_DUMP_ATTEMPTS
