"""Network namespace handles (attach, and prepare's DHCP): open a netns path without ever creating it,
and move the calling thread between namespaces.

setns(CLONE_NEWNET) changes only the calling thread. Attach runs each device
operation in a fresh thread that enters the pod netns for the sockets, sysctls and
ethtool it needs there, so the event loop's thread never changes namespace (no fork: pyroute2's
netns= argument instead forks a helper process per namespace, and passes
the socket back, about 7.5 ms per open).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os

CLONE_NEWNET = 0x40000000
NS_GET_NSTYPE = 0xB703  # ioctl on an nsfs fd: the CLONE_NEW* type of the namespace

_libc = ctypes.CDLL(None, use_errno=True)


class NetnsError(OSError):
    """A netns path that cannot be used; says which path and why."""


class NetnsGone(NetnsError):
    """The netns path does not exist (any more)."""


def open_netns(path: str) -> int:
    """An O_RDONLY fd of the network namespace at ``path`` (a bind mount under
    /var/run/netns or /proc/<pid>/ns/net). Never creates anything."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise NetnsGone(errno.ENOENT, f"network namespace {path} does not exist") from None
    except OSError as exc:
        raise NetnsError(exc.errno, f"cannot open network namespace {path}: {exc.strerror}") from None
    except ValueError:  # an embedded NUL: no such file can exist
        raise NetnsGone(errno.ENOENT, f"network namespace {path!r} does not exist") from None
    try:
        kind = fcntl.ioctl(fd, NS_GET_NSTYPE)
    except OSError:
        os.close(fd)
        raise NetnsError(errno.EINVAL, f"{path} is not a namespace file") from None
    if kind != CLONE_NEWNET:
        os.close(fd)
        raise NetnsError(errno.EINVAL, f"{path} is not a network namespace")
    return fd


def same_netns(fd_a: int, fd_b: int) -> bool:
    a, b = os.fstat(fd_a), os.fstat(fd_b)
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def setns(fd: int) -> None:
    """Move the calling thread into the netns ``fd``."""
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        code = ctypes.get_errno()
        raise NetnsError(code, f"setns: {os.strerror(code)}")
