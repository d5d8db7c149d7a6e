"""Attach trivial eBPF programs to a link, the two ways dranet reports them.

    ip netns exec NS python -m tests.integration.inventory.bpfprog IFNAME

loads a "return TC_ACT_OK" SCHED_CLS program twice: once attached through a tc
clsact ingress bpf filter named ``dranet_cls`` (netlink), once through a TCX
ingress link (BPF_LINK_CREATE) named ``dranet_tcx``. Prints "ready" and keeps the
TCX link (which lives as long as its fd) until stdin closes.
"""

from __future__ import annotations

import ctypes
import os
import struct
import sys

from pyroute2 import IPRoute

from services.inventory.bpf import _SYS_BPF, BPF_TCX_INGRESS

BPF_PROG_LOAD = 5
BPF_LINK_CREATE = 28
BPF_PROG_TYPE_SCHED_CLS = 3
# mov64 r0, 0 ; exit
INSNS = bytes.fromhex("b700000000000000") + bytes.fromhex("9500000000000000")

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def bpf(cmd: int, attr: ctypes.Array[ctypes.c_char]) -> int:
    ret = _libc.syscall(_SYS_BPF, ctypes.c_int(cmd), attr, ctypes.c_uint(len(attr)))
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"bpf({cmd}): {os.strerror(err)}")
    return int(ret)


def load(name: str) -> int:
    insns = ctypes.create_string_buffer(INSNS, len(INSNS))
    license_ = ctypes.create_string_buffer(b"GPL")
    attr = ctypes.create_string_buffer(128)
    struct.pack_into(
        "=IIQQ",
        attr,
        0,
        BPF_PROG_TYPE_SCHED_CLS,
        len(INSNS) // 8,
        ctypes.addressof(insns),
        ctypes.addressof(license_),
    )
    attr[48 : 48 + len(name)] = name.encode()  # prog_name
    return bpf(BPF_PROG_LOAD, attr)


def main() -> None:
    ifname = sys.argv[1]
    with IPRoute() as ipr:
        (index,) = ipr.link_lookup(ifname=ifname)
        cls_fd = load("dranet_cls")
        ipr.tc("add", "clsact", index)
        ipr.tc(
            "add-filter",
            "bpf",
            index,
            ":1",
            fd=cls_fd,
            name="dranet_cls",
            parent="ffff:fff2",
            classid=1,
            direct_action=True,
        )
    tcx_fd = load("dranet_tcx")
    attr = ctypes.create_string_buffer(64)
    struct.pack_into("=IIII", attr, 0, tcx_fd, index, BPF_TCX_INGRESS, 0)
    link_fd = bpf(BPF_LINK_CREATE, attr)
    print("ready", flush=True)
    sys.stdin.read()
    os.close(link_fd)


if __name__ == "__main__":
    main()
