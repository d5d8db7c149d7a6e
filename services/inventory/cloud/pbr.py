"""Policy-based routing pieces profiles hand out with an IPvlan child's address:
a per-device table, on-link and default routes in it, and one source rule per
address."""

from __future__ import annotations

from shared.netconfig.validate import RT_SCOPE_LINK, vrf_table_for

# Below the kernel's "from all lookup main" rule (32766) so a child's traffic
# uses its own table instead of falling through to the pod's default route.
# The value dranet uses (apis.SourceRoutingRulePriority) was not visible to us;
# 32000 is the one discussed for it upstream.
SOURCE_ROUTING_RULE_PRIORITY = 32000

__all__ = ["RT_SCOPE_LINK", "SOURCE_ROUTING_RULE_PRIORITY", "table_for_name"]


def table_for_name(name: str) -> int:
    """dranet's TableIDForName: VRF tables and per-device PBR tables share one
    derivation (fnv32a(name) % 1000 + 1000)."""
    return vrf_table_for(name)
