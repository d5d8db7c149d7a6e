"""Merging NetworkConfigs (seed steps 2 and 3; dranet apis.MergeNetworkConfig).

``merge(user, base)``: the user's config over a base (the provider config, or in
step 3 the profile). A scalar set in ``user`` wins; an unset one (None, "", 0)
takes the base value. Lists are the base entries followed by the user entries,
de-duplicated keeping the user's entry at the position of its last occurrence:
addresses by value, routes by (destination, table), neighbors by destination,
rules by all their fields. Maps (ethtool) merge key by key, user keys winning.

Step 3 is the same function with the profile as the base: the profile only fills
what is still unset and adds list entries.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import fields, is_dataclass, replace
from typing import Any, TypeVar

from shared.netconfig.model import NeighborConfig, NetworkConfig, RouteConfig, RuleConfig

T = TypeVar("T")


def _dedup_keep_last(items: Iterable[T], key: Callable[[T], Hashable]) -> tuple[T, ...]:
    """Drop earlier items whose key appears again later; keeps relative order."""
    items = list(items)
    seen: set[Hashable] = set()
    out: list[T] = []
    for item in reversed(items):
        k = key(item)
        if k not in seen:
            seen.add(k)
            out.append(item)
    out.reverse()
    return tuple(out)


def _route_key(r: RouteConfig) -> Hashable:
    return (r.destination, r.table)


def _neighbor_key(n: NeighborConfig) -> Hashable:
    return n.destination


def _rule_key(r: RuleConfig) -> Hashable:
    return (r.priority, r.source, r.destination, r.table)


def _is_unset(value: Any) -> bool:
    # mergo's isEmptyValue: nil pointers, "", 0 and empty collections are unset;
    # a pointer to false/0 (Python False/0 in an Optional field) is set.
    return value is None or value == "" or value == () or (isinstance(value, Mapping) and not value)


def _merge_struct(user: Any, base: Any) -> Any:
    if user is None:
        return base
    if base is None:
        return user
    changes: dict[str, Any] = {}
    for f in fields(user):
        u = getattr(user, f.name)
        b = getattr(base, f.name)
        if isinstance(u, tuple) or isinstance(b, tuple):
            changes[f.name] = tuple(b) + tuple(u)
        elif isinstance(u, Mapping) or isinstance(b, Mapping):
            merged = dict(b or {})
            merged.update(u or {})
            changes[f.name] = merged
        elif is_dataclass(u) or is_dataclass(b):
            changes[f.name] = _merge_struct(u, b)
        elif isinstance(u, int) and not isinstance(u, bool) and f.default == 0:
            # Plain Go ints (route table, rule priority): 0 is unset.
            changes[f.name] = u if u != 0 else b
        else:
            changes[f.name] = b if _is_unset(u) else u
    return replace(user, **changes)


def merge(user: NetworkConfig, base: NetworkConfig | None) -> NetworkConfig:
    """The user's config over ``base``; see the module docstring for the rules."""
    if base is None:
        return user
    merged: NetworkConfig = _merge_struct(user, base)
    itf = replace(merged.interface, addresses=_dedup_keep_last(merged.interface.addresses, lambda a: a))
    return replace(
        merged,
        interface=itf,
        routes=_dedup_keep_last(merged.routes, _route_key),
        rules=_dedup_keep_last(merged.rules, _rule_key),
        neighbors=_dedup_keep_last(merged.neighbors, _neighbor_key),
    )
