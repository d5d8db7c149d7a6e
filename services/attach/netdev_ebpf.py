"""Detach eBPF programs from an interface (interface.disableEbpfPrograms).

Two kinds, as dranet: tc "bpf" filters on the clsact ingress/egress hooks, and TCX
programs. TCX programs attached with BPF_PROG_ATTACH are detached with
BPF_PROG_DETACH; those held by a bpf_link (BPF_LINK_CREATE) with BPF_LINK_DETACH,
which dranet does not do (it only unpins pinned links at prepare).

Kernel facts checked on this machine (6.18): a netns move destroys the device's
qdiscs, so tc filters set on the host are gone once the device is in the pod; TCX
programs and links survive the move. The bpf() calls resolve the ifindex in the
calling thread's netns: run this in a thread inside the pod netns.
"""

from __future__ import annotations

import ctypes
import os
import struct

from services.attach.netdev_nl import NetlinkError, NlSocket
from shared.rtnl.codec import TC_H_MIN_EGRESS, TC_H_MIN_INGRESS

SYS_BPF = 321  # x86_64
BPF_PROG_DETACH = 9
BPF_PROG_GET_FD_BY_ID = 13
BPF_PROG_QUERY = 16
BPF_LINK_GET_FD_BY_ID = 30
BPF_LINK_DETACH = 34
BPF_TCX_INGRESS = 46
BPF_TCX_EGRESS = 47
_ATTR_SIZE = 128
_MAX_PROGS = 64

_libc = ctypes.CDLL(None, use_errno=True)


class BpfError(OSError):
    pass


def bpf(cmd: int, attr: bytes | bytearray) -> int:
    """The bpf(2) syscall; returns its result, raises BpfError."""
    buf = ctypes.create_string_buffer(bytes(attr).ljust(_ATTR_SIZE, b"\0"), _ATTR_SIZE)
    return _bpf(cmd, buf)


def _bpf(cmd: int, buf: ctypes.Array[ctypes.c_char]) -> int:
    res = int(_libc.syscall(SYS_BPF, cmd, buf, _ATTR_SIZE))
    if res < 0:
        code = ctypes.get_errno()
        raise BpfError(code, f"bpf cmd {cmd}: {os.strerror(code)}")
    return res


def tcx_query(ifindex: int, attach_type: int) -> list[tuple[int, int]]:
    """(program id, link id or 0) of the TCX programs on ``ifindex``."""
    prog_ids = (ctypes.c_uint32 * _MAX_PROGS)()
    link_ids = (ctypes.c_uint32 * _MAX_PROGS)()
    buf = ctypes.create_string_buffer(_ATTR_SIZE)
    # union bpf_attr.query: target_ifindex, attach_type, query_flags, attach_flags,
    # prog_ids, count, pad, prog_attach_flags, link_ids, link_attach_flags, revision
    struct.pack_into("=IIIIQI", buf, 0, ifindex, attach_type, 0, 0, ctypes.addressof(prog_ids), _MAX_PROGS)
    struct.pack_into("=Q", buf, 40, ctypes.addressof(link_ids))
    _bpf(BPF_PROG_QUERY, buf)
    (count,) = struct.unpack_from("=I", buf, 24)
    count = min(count, _MAX_PROGS)
    return [(prog_ids[i], link_ids[i]) for i in range(count)]


def _detach_tcx(ifindex: int, attach_type: int, prog_id: int, link_id: int) -> None:
    if link_id:
        fd = bpf(BPF_LINK_GET_FD_BY_ID, struct.pack("=I", link_id))
        try:
            bpf(BPF_LINK_DETACH, struct.pack("=I", fd))
        finally:
            os.close(fd)
        return
    fd = bpf(BPF_PROG_GET_FD_BY_ID, struct.pack("=I", prog_id))
    try:
        # target_ifindex, attach_bpf_fd, attach_type
        bpf(BPF_PROG_DETACH, struct.pack("=III", ifindex, fd, attach_type))
    finally:
        os.close(fd)


def detach_all(sock: NlSocket, ifindex: int) -> list[str]:
    """Remove tc bpf filters and TCX programs from ``ifindex``; returns what was
    removed (for the log). Raises on the first failure, naming it."""
    removed: list[str] = []
    for parent, hook in ((TC_H_MIN_INGRESS, "ingress"), (TC_H_MIN_EGRESS, "egress")):
        try:
            filters = sock.tc_filters(ifindex, parent)
        except NetlinkError:
            continue  # no clsact qdisc: nothing to list (dranet skips these too)
        for handle, fparent, info, chain, kind in filters:
            if kind != "bpf" or not handle:
                continue  # the per-priority header entry has handle 0
            try:
                sock.delete_tc_filter(ifindex, handle, fparent, info, chain, kind)
            except NetlinkError as exc:
                raise BpfError(
                    exc.errno, f"delete tc {hook} bpf filter handle {handle:#x}: {exc.strerror}"
                ) from None
            removed.append(f"tc {hook} filter pref {info >> 16} handle {handle:#x}")
    for attach_type, hook in ((BPF_TCX_INGRESS, "tcx ingress"), (BPF_TCX_EGRESS, "tcx egress")):
        try:
            progs = tcx_query(ifindex, attach_type)
        except BpfError as exc:
            raise BpfError(exc.errno, f"query {hook} programs: {exc.strerror}") from None
        for prog_id, link_id in progs:
            try:
                _detach_tcx(ifindex, attach_type, prog_id, link_id)
            except BpfError as exc:
                what = f"link {link_id}" if link_id else f"program {prog_id}"
                raise BpfError(exc.errno, f"detach {hook} {what}: {exc.strerror}") from None
            removed.append(f"{hook} program {prog_id}" + (f" (link {link_id})" if link_id else ""))
    return removed
