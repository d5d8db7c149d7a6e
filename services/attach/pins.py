"""Pins of pod network namespaces that outlive the attach process.

The runtime removes a pod's netns path when its sandbox stops. If nothing else holds
the netns, the kernel destroys it: a physical NIC inside falls back to the host's
first netns under a kernel-chosen name and without its host config, and a virtual
one (veth, IPvlan child) dies. While attach runs, its open fd holds the netns until
the devices are moved out; but attach may be down right then (a crash, an upgrade,
the driver pod deleted). So attach also bind-mounts each pod netns that holds our
devices onto a file in ``pin_dir``: a mount is held by the mount table, not by a
process. A restarted attach finds the pins, moves the devices of gone pods back to
the host through them, and removes them.

In the DaemonSet the directory is a hostPath mounted with Bidirectional propagation,
so the pins land in the host's mount namespace and survive the container; it must
be on a shared mount on the host (``/`` is, on systemd hosts). A reboot empties it
with the rest of ``/run``, as it does the netns paths.

Pin files are named ``<pod uid>_<sandbox id>``; both come from the runtime and are
checked against a strict alphabet, so no name can leave the directory.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from shared.logs import log_fields

log = logging.getLogger(__name__)

MS_BIND = 0x1000
MNT_DETACH = 0x2
# A pod uid is a UUID, a sandbox id a 64-hex digest; both at most 128 of these characters.
_PART = re.compile(r"[A-Za-z0-9-]{1,128}")

_libc = ctypes.CDLL(None, use_errno=True)


class PinError(OSError):
    """A pin could not be made or removed; says which path and why."""


@dataclass(frozen=True)
class Pin:
    pod_uid: str
    sandbox_id: str
    path: str


def _mounted(path: Path) -> bool:
    """A bind-mounted nsfs file has another device than the directory it sits in."""
    try:
        return path.stat().st_dev != path.parent.stat().st_dev
    except OSError:
        return False


class NetnsPins:
    """The pins in one directory; ``None``: pinning is off (the open fd is the only
    reference, as before)."""

    def __init__(self, directory: str | Path | None) -> None:
        self.dir = Path(directory) if directory else None

    @property
    def enabled(self) -> bool:
        return self.dir is not None

    def _path(self, pod_uid: str, sandbox_id: str) -> Path | None:
        if self.dir is None:
            return None
        if not (_PART.fullmatch(pod_uid) and _PART.fullmatch(sandbox_id)):
            raise PinError(
                errno.EINVAL,
                f"cannot pin the netns of pod {pod_uid!r} sandbox {sandbox_id!r}: "
                "a uid or sandbox id outside [A-Za-z0-9-]{1,128}",
            )
        return self.dir / f"{pod_uid}_{sandbox_id}"

    def pin(self, pod_uid: str, sandbox_id: str, netns: str) -> str | None:
        """Bind-mount ``netns`` (a path, or /proc/<pid>/fd/<n> of an open netns fd)
        onto the pin of this sandbox; its path, or None when pinning is off. Pinning
        twice is one pin."""
        path = self._path(pod_uid, sandbox_id)
        if path is None:
            return None
        if _mounted(path):
            return str(path)
        path.touch(mode=0o600, exist_ok=True)
        if _libc.mount(netns.encode(), str(path).encode(), None, MS_BIND, None) != 0:
            code = ctypes.get_errno()
            with contextlib.suppress(OSError):
                path.unlink()
            raise PinError(code, f"cannot pin netns {netns} at {path}: {os.strerror(code)}")
        return str(path)

    def get(self, pod_uid: str, sandbox_id: str) -> str | None:
        """The pin's path if this sandbox's netns is pinned."""
        path = self._path(pod_uid, sandbox_id)
        return str(path) if path is not None and _mounted(path) else None

    def unpin(self, pod_uid: str, sandbox_id: str) -> None:
        """Remove the pin (the netns goes once nothing else holds it); no pin: nothing."""
        path = self._path(pod_uid, sandbox_id)
        if path is None:
            return
        if _mounted(path) and _libc.umount2(str(path).encode(), MNT_DETACH) != 0:
            code = ctypes.get_errno()
            raise PinError(code, f"cannot remove the netns pin {path}: {os.strerror(code)}")
        with contextlib.suppress(FileNotFoundError):
            path.unlink()

    def all(self) -> list[Pin]:
        """Every pin in the directory; stray files (no mount, odd names) are removed."""
        if self.dir is None or not self.dir.is_dir():
            return []
        out = []
        for f in sorted(self.dir.iterdir()):
            uid, _, sandbox = f.name.partition("_")
            if not (_PART.fullmatch(uid) and _PART.fullmatch(sandbox)) or not _mounted(f):
                if not _mounted(f):
                    log.warning(
                        "removing a stray file in the netns pin directory", extra=log_fields(path=str(f))
                    )
                    with contextlib.suppress(OSError):
                        f.unlink()
                continue
            out.append(Pin(uid, sandbox, str(f)))
        return out

    def of_pod(self, pod_uid: str) -> list[Pin]:
        return [p for p in self.all() if p.pod_uid == pod_uid]
