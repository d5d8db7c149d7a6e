"""ethtool features and private flags of an interface, through pyroute2's ioctl
ethtool (SIOCETHTOOL works on the calling thread's netns, so the caller runs this
in a thread that entered the pod netns).

Feature names are the kernel's (``ethtool -k`` long list). dranet translates the
legacy short and long aliases (tso, gro, rx-checksumming, ...) at prepare; they are
resolved here too, so a config stored without that translation still works.
"""

from __future__ import annotations

import ctypes
import fcntl
from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase

from pyroute2.ethtool.ioctl import SIOCETHTOOL, EthtoolValue, IfReq, IoctlEthtool

ETH_SS_PRIV_FLAGS = 2
ETHTOOL_GPFLAGS = 0x27
ETHTOOL_SPFLAGS = 0x28

# Legacy offload names -> the kernel feature names they stand for (ethtool's
# off_flag_def table: short name, long name, kernel name pattern).
_LEGACY = (
    ("rx", "rx-checksumming", "rx-checksum"),
    ("tx", "tx-checksumming", "tx-checksum-*"),
    ("sg", "scatter-gather", "tx-scatter-gather*"),
    ("tso", "tcp-segmentation-offload", "tx-tcp*-segmentation"),
    ("ufo", "udp-fragmentation-offload", "tx-udp-fragmentation"),
    ("gso", "generic-segmentation-offload", "tx-generic-segmentation"),
    ("gro", "generic-receive-offload", "rx-gro"),
    ("lro", "large-receive-offload", "rx-lro"),
    ("rxvlan", "rx-vlan-offload", "rx-vlan-hw-parse"),
    ("txvlan", "tx-vlan-offload", "tx-vlan-hw-insert"),
    ("ntuple", "ntuple-filters", "rx-ntuple-filter"),
    ("rxhash", "receive-hashing", "rx-hashing"),
)
LEGACY_PATTERNS = {alias: pattern for short, long, pattern in _LEGACY for alias in (short, long)}


class EthtoolError(OSError):
    pass


def resolve_features(wanted: Mapping[str, bool], known: Iterable[str]) -> dict[str, bool]:
    """Kernel feature names for ``wanted`` (aliases expanded). EthtoolError names any
    feature the interface does not have."""
    names = list(known)
    out: dict[str, bool] = {}
    missing = []
    for name, value in wanted.items():
        if name in names:
            out[name] = value
            continue
        pattern = LEGACY_PATTERNS.get(name)
        matched = [n for n in names if pattern and fnmatchcase(n, pattern)]
        if not matched:
            missing.append(name)
        for n in matched:
            out[n] = value
    if missing:
        raise EthtoolError(0, f"feature(s) {', '.join(sorted(missing))} not supported by the interface")
    return out


def set_features(ifname: str, wanted: Mapping[str, bool]) -> dict[str, bool]:
    """Set features; returns the previous values of those that changed (for undo).
    Fails naming the features the kernel left unchanged (fixed ones)."""
    io = IoctlEthtool(ifname)
    try:
        feats = io.get_features()
        target = resolve_features(wanted, feats.keys())
        before = {n: bool(feats.is_active(n)) for n in target}
        changes = {n: v for n, v in target.items() if before[n] != v}
        if not changes:
            return {}
        for name, value in changes.items():
            feats.set_value(name, value)
        io.set_features(feats)
        after = io.get_features()
        stuck = sorted(n for n, v in changes.items() if bool(after.is_active(n)) != v)
        if stuck:
            fixed = [n for n in stuck if after.is_never_changed(n) or not after.is_available(n)]
            raise EthtoolError(
                0,
                f"could not set feature(s) {', '.join(f'{n}={changes[n]}' for n in stuck)}"
                + (f" ({', '.join(fixed)} fixed on this interface)" if fixed else ""),
            )
        return {n: before[n] for n in changes}
    finally:
        io.close()


def _pflags(io: IoctlEthtool, cmd: int, data: int = 0) -> int:
    value = EthtoolValue(cmd=cmd, data=data)
    req = IfReq()
    req.ifr_name = io.ifreq.ifr_name
    req.value = ctypes.pointer(value)
    fcntl.ioctl(io.sock, SIOCETHTOOL, req)
    return int(value.data)


def set_private_flags(ifname: str, wanted: Mapping[str, bool]) -> dict[str, bool]:
    """Set driver private flags (ethtool --set-priv-flags); returns the previous
    values of those that changed."""
    io = IoctlEthtool(ifname)
    try:
        # A driver without private flags reports a set of length 0 and refuses to list it.
        count = io.get_stringset_length(ETH_SS_PRIV_FLAGS)
        names = io.get_stringset(set_id=ETH_SS_PRIV_FLAGS) if count else []
        missing = sorted(n for n in wanted if n not in names)
        if missing:
            have = ", ".join(names) if names else "none"
            raise EthtoolError(
                0, f"private flag(s) {', '.join(missing)} not supported (interface has: {have})"
            )
        bits = _pflags(io, ETHTOOL_GPFLAGS)
        before = {n: bool(bits & (1 << names.index(n))) for n in wanted}
        new = bits
        for name, value in wanted.items():
            bit = 1 << names.index(name)
            new = (new | bit) if value else (new & ~bit)
        if new == bits:
            return {}
        _pflags(io, ETHTOOL_SPFLAGS, new)
        return {n: v for n, v in before.items() if v != wanted[n]}
    finally:
        io.close()
