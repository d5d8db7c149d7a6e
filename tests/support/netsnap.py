"""A network namespace's state for some interfaces, as plain data to compare between two runs:
links, addresses, routes in every table, rules, permanent neighbors, per-interface sysctls and
ethtool features. What differs between two identical runs by nature (ifindex, statistics,
lifetimes, the kernel's own link-local and table-local entries) is left out.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterable
from typing import Any

LINK_KEYS = (
    "ifname", "mtu", "address", "operstate", "flags", "gso_max_size", "gro_max_size",
    "gso_ipv4_max_size", "gro_ipv4_max_size", "altnames",
)  # fmt: skip
SYSCTLS = (
    "ipv4/conf/{}/forwarding",
    "ipv4/conf/{}/arp_ignore",
    "ipv4/conf/{}/arp_announce",
    "ipv6/conf/{}/forwarding",
)
ROUTE_KEYS = ("dst", "gateway", "prefsrc", "scope", "table", "protocol", "metric", "type")
RULE_KEYS = ("priority", "src", "srclen", "dst", "dstlen", "table", "iif", "oif")


def _run(netns: str | None, argv: list[str]) -> subprocess.CompletedProcess[str]:
    cmd = ["ip", "netns", "exec", netns, *argv] if netns else argv
    return subprocess.run(cmd, capture_output=True, text=True)


def ip_json(netns: str | None, *args: str) -> list[dict[str, Any]]:
    res = subprocess.run(
        ["ip", "-j", *(["-n", netns] if netns else []), *args], capture_output=True, text=True
    )
    return json.loads(res.stdout) if res.returncode == 0 and res.stdout.strip() else []


def ethtool_features(netns: str | None, name: str) -> dict[str, str]:
    """``ethtool -k``: feature -> "on"/"off" (with " [fixed]" where the driver fixes it)."""
    res = _run(netns, ["ethtool", "-k", name])
    out = {}
    for line in res.stdout.splitlines()[1:]:
        key, _, value = line.strip().partition(": ")
        if value:
            out[key] = value.strip()
    return out


def sysctls(netns: str | None, name: str) -> dict[str, str]:
    res = _run(netns, ["sh", "-c", "; ".join(f"cat /proc/sys/net/{s.format(name)}" for s in SYSCTLS)])
    values = res.stdout.split()
    return {s.format("IF"): v for s, v in zip(SYSCTLS, values, strict=False)}


def snapshot(netns: str | None, names: Iterable[str]) -> dict[str, Any]:
    """The state of the interfaces ``names`` in ``netns`` (None: this namespace); an interface
    that is not there is ``None``."""
    names = sorted(names)
    links = {e["ifname"]: e for e in ip_json(netns, "-d", "link", "show")}
    out: dict[str, Any] = {}
    for name in names:
        e = links.get(name)
        if e is None:
            out[name] = None
            continue
        link = {k: e.get(k) for k in LINK_KEYS if k in e}
        link["flags"] = sorted(link.get("flags") or [])
        addrs = sorted(
            f"{a['local']}/{a['prefixlen']}"
            for itf in ip_json(netns, "addr", "show", "dev", name)
            for a in itf.get("addr_info", [])
            if a.get("scope") != "link"
        )
        routes = sorted(
            (
                {k: r[k] for k in ROUTE_KEYS if k in r}
                for fam in ("-4", "-6")
                for r in ip_json(netns, fam, "route", "show", "table", "all", "dev", name)
                # The kernel's own: table local, IPv6 link-local and multicast.
                if r.get("table") != "local" and not str(r.get("dst", "")).startswith(("fe80", "ff00"))
            ),
            key=json.dumps,
        )
        neigh = sorted(
            (n["dst"], n.get("lladdr"))
            for fam in ("-4", "-6")
            for n in ip_json(netns, fam, "neigh", "show", "dev", name)
            if "PERMANENT" in n.get("state", [])
        )
        out[name] = {
            "link": link,
            "addresses": addrs,
            "routes": routes,
            "neighbors": [list(n) for n in neigh],
            "sysctls": sysctls(netns, name),
            "ethtool": ethtool_features(netns, name),
        }
    return out


def rules(netns: str | None) -> list[dict[str, Any]]:
    """Policy rules of both families, without the kernel's three defaults."""
    out = []
    for fam in ("-4", "-6"):
        for r in ip_json(netns, fam, "rule", "show"):
            if r.get("priority") in (0, 32766, 32767) and r.get("src") == "all" and "dst" not in r:
                continue
            out.append({k: r[k] for k in RULE_KEYS if k in r})
    return sorted(out, key=json.dumps)


def interfaces(netns: str | None, skip: Iterable[str] = ("lo", "eth0")) -> list[str]:
    """The names of the links in ``netns`` but ``skip``."""
    return sorted(e["ifname"] for e in ip_json(netns, "link", "show") if e["ifname"] not in set(skip))


def diff(a: Any, b: Any, path: str = "") -> list[str]:
    """The paths where ``a`` and ``b`` differ, with both values: ``path: a != b``."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            out += diff(a.get(k, "<absent>"), b.get(k, "<absent>"), f"{path}.{k}" if path else str(k))
        return out
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]
