"""One blocking netlink socket: send a request, read its replies, retry interrupted dumps.

A socket belongs to the network namespace of the thread that created it, for its
whole life, and is not thread-safe: callers run it in a worker thread (inventory)
or in the thread that entered the pod netns (attach), one socket per thread.
"""

from __future__ import annotations

import errno
import logging
import socket
from collections.abc import Callable, Iterator
from typing import Self, TypeVar

from shared.rtnl.codec import (
    NETLINK_CAP_ACK,
    NETLINK_EXT_ACK,
    NETLINK_GET_STRICT_CHK,
    NETLINK_ROUTE,
    NLM_F_ACK,
    NLM_F_DUMP,
    NLM_F_DUMP_INTR,
    NLM_F_MULTI,
    NLM_F_REQUEST,
    NLMSG_DONE,
    NLMSG_ERROR,
    SOL_NETLINK,
    NetlinkError,
    decode_error,
    done_errno,
    iter_messages,
    message,
)

log = logging.getLogger(__name__)

# dranet's internal/nlwrap rule: up to five attempts, then the last (possibly
# inconsistent) result is used.
MAX_DUMP_ATTEMPTS = 5

T = TypeVar("T")


class NetlinkSocket:
    """A netlink socket bound in the calling thread's netns.

    ``groups``: multicast groups to join. ``rcvbuf``: SO_RCVBUF, for sockets that
    may fall behind. ``strict_check``: NETLINK_GET_STRICT_CHK, so the kernel honours
    the filters in dump requests (ignored by kernels without it). ``ext_ack``: the
    kernel's error text with each error, and errors without the echoed request.
    ``bufsize``: the largest datagram read; a bigger one is an EMSGSIZE error, never
    silently cut (dump datagrams are at most 32 KiB).
    """

    def __init__(
        self,
        protocol: int = NETLINK_ROUTE,
        groups: int = 0,
        *,
        rcvbuf: int = 0,
        strict_check: bool = False,
        ext_ack: bool = False,
        bufsize: int = 1 << 16,
    ) -> None:
        self.proto = protocol
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, protocol)
        try:
            if rcvbuf:
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
            if ext_ack:
                self.sock.setsockopt(SOL_NETLINK, NETLINK_EXT_ACK, 1)
                self.sock.setsockopt(SOL_NETLINK, NETLINK_CAP_ACK, 1)
            if strict_check:
                try:
                    self.sock.setsockopt(SOL_NETLINK, NETLINK_GET_STRICT_CHK, 1)
                except OSError:
                    pass  # an older kernel: the decoders filter again, it only costs bandwidth
            self.sock.bind((0, groups))
        except BaseException:
            self.sock.close()
            raise
        self._seq = 0
        self._buf = bytearray(bufsize)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, mtype: int, flags: int, payload: bytes) -> int:
        """Send one message with the next sequence number; that number."""
        self._seq = (self._seq + 1) & 0xFFFFFFFF or 1
        self.sock.send(message(mtype, flags, self._seq, payload))
        return self._seq

    def messages(self, mtype: int, flags: int, payload: bytes) -> Iterator[tuple[int, int, memoryview]]:
        """Send one request (``flags`` as given: NLM_F_REQUEST, NLM_F_DUMP, NLM_F_ACK...)
        and yield (type, flags, body) of each reply until the dump's DONE, the ack, or
        the single answer of a request that asked for neither. The DONE of an
        interrupted dump is yielded too, so the caller sees NLM_F_DUMP_INTR.

        A body is a view of the receive buffer: valid until the next iteration.
        Raises NetlinkError for the kernel's errors, MalformedError for bytes that
        cannot be framed."""
        seq = self.send(mtype, flags, payload)
        single = (flags & NLM_F_DUMP) != NLM_F_DUMP and not flags & NLM_F_ACK
        buf = self._buf
        while True:
            n = self.sock.recv_into(buf, 0, socket.MSG_TRUNC)
            if n > len(buf):
                raise NetlinkError(errno.EMSGSIZE, f"reply of {n} bytes does not fit")
            for rtype, rflags, rseq, body in iter_messages(memoryview(buf)[:n]):
                if rseq != seq:
                    continue  # a late reply to an earlier request, or a notification
                if rtype == NLMSG_ERROR:
                    code, msg = decode_error(body, rflags)
                    if code:
                        raise NetlinkError(code, msg)
                    return  # the ack
                if rtype == NLMSG_DONE:
                    code = done_errno(body)
                    if code:
                        raise NetlinkError(code)
                    if rflags & NLM_F_DUMP_INTR:
                        yield rtype, rflags, body
                    return  # with NLM_F_ACK the kernel sends no ack after a dump's DONE
                yield rtype, rflags, body
                if single and not rflags & NLM_F_MULTI:
                    return

    def dump(self, mtype: int, payload: bytes, decode: Callable[[int, memoryview], T | None]) -> list[T]:
        """One dump, each message decoded (None: skipped); retried while the kernel
        flags it NLM_F_DUMP_INTR (the table changed while it was being dumped)."""
        last: list[T] = []
        for attempt in range(MAX_DUMP_ATTEMPTS):
            out: list[T] = []
            interrupted = False
            for rtype, rflags, body in self.messages(mtype, NLM_F_REQUEST | NLM_F_DUMP, payload):
                if rflags & NLM_F_DUMP_INTR:
                    interrupted = True
                if rtype == NLMSG_DONE:
                    continue
                item = decode(rtype, body)
                if item is not None:
                    out.append(item)
            if not interrupted:
                return out
            last = out
            log.debug("netlink dump interrupted, retrying", extra={"attempt": attempt + 1, "type": mtype})
        log.info("netlink dump still interrupted after %d attempts; using its result", MAX_DUMP_ATTEMPTS)
        return last
