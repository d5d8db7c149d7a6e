"""Names of the eBPF programs attached to a link through TCX (kernel 6.6+).

dranet asks the kernel with BPF_PROG_QUERY for the TCX ingress and egress attach
points of each link and reads each program's name. Python has no bpf(2)
wrapper, so this goes through libc's syscall(). A kernel without TCX, or a
process without CAP_BPF, simply reports no programs.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import platform
import struct

log = logging.getLogger(__name__)

BPF_PROG_QUERY = 16
BPF_PROG_GET_FD_BY_ID = 13
BPF_OBJ_GET_INFO_BY_FD = 15
BPF_TCX_INGRESS = 46
BPF_TCX_EGRESS = 47
BPF_OBJ_NAME_LEN = 16
_PROG_INFO_NAME_OFFSET = 64  # struct bpf_prog_info: ... map_ids (u64 at 56), name[16] at 64
_ATTR_SIZE = 128
_MAX_PROGS = 64

_SYS_BPF = {"x86_64": 321, "aarch64": 280, "arm64": 280, "ppc64le": 361, "s390x": 351}.get(platform.machine())
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _bpf(cmd: int, attr: ctypes.Array[ctypes.c_char]) -> int:
    if _SYS_BPF is None:
        raise OSError(errno.ENOSYS, "bpf(2) number unknown for this architecture")
    ret = _libc.syscall(_SYS_BPF, ctypes.c_int(cmd), attr, ctypes.c_uint(_ATTR_SIZE))
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return int(ret)


def _prog_ids(ifindex: int, attach_type: int) -> list[int]:
    ids = (ctypes.c_uint32 * _MAX_PROGS)()
    attr = ctypes.create_string_buffer(_ATTR_SIZE)
    # union bpf_attr.query: target_ifindex, attach_type, query_flags, attach_flags,
    # prog_ids (u64 pointer), prog_cnt.
    struct.pack_into("=IIIIQI", attr, 0, ifindex, attach_type, 0, 0, ctypes.addressof(ids), _MAX_PROGS)
    _bpf(BPF_PROG_QUERY, attr)
    (count,) = struct.unpack_from("=I", attr, 24)
    return [ids[i] for i in range(min(count, _MAX_PROGS))]


def _prog_name(prog_id: int) -> str | None:
    attr = ctypes.create_string_buffer(_ATTR_SIZE)
    struct.pack_into("=I", attr, 0, prog_id)
    fd = _bpf(BPF_PROG_GET_FD_BY_ID, attr)
    try:
        info = ctypes.create_string_buffer(256)
        attr = ctypes.create_string_buffer(_ATTR_SIZE)
        struct.pack_into("=IIQ", attr, 0, fd, len(info), ctypes.addressof(info))
        _bpf(BPF_OBJ_GET_INFO_BY_FD, attr)
        raw = info.raw[_PROG_INFO_NAME_OFFSET : _PROG_INFO_NAME_OFFSET + BPF_OBJ_NAME_LEN]
        return raw.split(b"\0", 1)[0].decode(errors="replace")
    finally:
        os.close(fd)


class TcxQuery:
    """Queries TCX programs; remembers that the kernel lacks TCX after the first
    EINVAL so a scan of many links does not keep asking."""

    def __init__(self) -> None:
        self.supported = True

    def programs(self, ifindex: int) -> tuple[list[str], bool]:
        """(sorted program names, whether any program is attached)."""
        if not self.supported:
            return [], False
        names: set[str] = set()
        found = False
        for attach in (BPF_TCX_INGRESS, BPF_TCX_EGRESS):
            try:
                ids = _prog_ids(ifindex, attach)
            except OSError as exc:
                if exc.errno in (errno.EINVAL, errno.ENOSYS, errno.EPERM, errno.EOPNOTSUPP):
                    self._unsupported(exc)
                    return [], False
                # ENODEV and friends: the link went away mid-scan.
                return [], False
            if not ids:
                continue
            found = True
            for prog_id in ids:
                try:
                    name = _prog_name(prog_id)
                except OSError:
                    continue  # detached in between
                if name:
                    names.add(name)
        return sorted(names), found

    def _unsupported(self, exc: OSError) -> None:
        if self.supported:
            log.info("TCX program query unavailable, not reporting tcx programs: %s", exc)
        self.supported = False
