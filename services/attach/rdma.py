"""RDMA for attach: moving an RDMA link device between netns (exclusive mode; the
node's mode comes with each DeviceConfig), and checking the device files
CreateContainer adds.

The RDMA netlink part is untested on a real kernel here: this machine's kernel has no
RDMA netlink (socket(AF_NETLINK, .., NETLINK_RDMA) fails with EPROTONOSUPPORT). The
message encoding is unit-tested; the real moves need the VM with rdma_rxe.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, replace

from services.attach.netdev_nl import NETLINK_RDMA, NetlinkError, NlSocket
from shared.attachplan import DeviceNode

RDMA_DEV_DIR = "/dev/infiniband"


def rdma_socket() -> NlSocket:
    """An RDMA netlink socket in the calling thread's netns, with a clear error on a
    kernel without RDMA netlink."""
    try:
        return NlSocket(NETLINK_RDMA)
    except OSError as exc:
        if exc.errno in (errno.EPROTONOSUPPORT, errno.EAFNOSUPPORT):
            raise NetlinkError(
                exc.errno, "RDMA netlink is not available on this kernel (ib_core not loaded)"
            ) from None
        raise


def find_rdma_device(sock: NlSocket, name: str) -> int | None:
    """Index of the RDMA device ``name`` in the socket's netns, None if absent."""
    return sock.rdma_devices().get(name)


@dataclass(frozen=True)
class NodeProblem:
    path: str
    problem: str

    def __str__(self) -> str:
        return f"{self.path}: {self.problem}"


def check_device_nodes(
    nodes: tuple[DeviceNode, ...], dev_root: str = "/"
) -> tuple[tuple[DeviceNode, ...], list[NodeProblem]]:
    """The device nodes as they are on this host now, and the problems found.

    A path that is not a file directly in /dev/infiniband is refused (a problem; the
    node is dropped). Each stored node is looked up under ``dev_root``: a missing path
    or one that is not a device of the stored type is a problem (the node is dropped);
    a different major/minor (the devices were re-created since prepare) is reported and the
    current numbers are used; an unset mode, uid or gid takes the file's.
    """
    out: list[DeviceNode] = []
    problems: list[NodeProblem] = []
    for node in nodes:
        # Only RDMA character devices are ever added: a stored path anywhere else
        # (/dev/sda, /dev/infiniband/../mem) would hand the container another device.
        if (
            "\x00" in node.path
            or os.path.normpath(node.path) != node.path
            or os.path.dirname(node.path) != RDMA_DEV_DIR
        ):
            problems.append(NodeProblem(node.path, f"is not a file directly under {RDMA_DEV_DIR}; refused"))
            continue
        path = os.path.join(dev_root, node.path.lstrip("/"))
        try:
            st = os.stat(path)
        except OSError as exc:
            problems.append(NodeProblem(node.path, f"cannot stat: {exc.strerror}"))
            continue
        kind = "c" if stat.S_ISCHR(st.st_mode) else "b" if stat.S_ISBLK(st.st_mode) else ""
        if not kind:
            problems.append(NodeProblem(node.path, "is not a device file"))
            continue
        if kind != node.type:
            problems.append(NodeProblem(node.path, f"is a {kind} device, config says {node.type}"))
            continue
        major, minor = os.major(st.st_rdev), os.minor(st.st_rdev)
        if (major, minor) != (node.major, node.minor):
            problems.append(
                NodeProblem(
                    node.path,
                    f"is {major}:{minor} now, config says {node.major}:{node.minor}; using {major}:{minor}",
                )
            )
        out.append(
            replace(
                node,
                major=major,
                minor=minor,
                file_mode=node.file_mode if node.file_mode is not None else stat.S_IMODE(st.st_mode),
                uid=node.uid if node.uid is not None else st.st_uid,
                gid=node.gid if node.gid is not None else st.st_gid,
            )
        )
    return tuple(out), problems
