"""The DHCP exchange itself, on pyroute2's client (see services/prepare/dhcp.py for what is
taken from the ACK and why). A module of its own so that pyroute2 is imported by the first
claim with ``interface.dhcp``, not by every prepare process: it costs about 24 MiB.
"""

from __future__ import annotations

import functools
import logging
import time

from pyroute2 import AsyncIPRoute
from pyroute2.dhcp import fsm
from pyroute2.dhcp.client import AsyncDHCPClient, ClientConfig, randomized_increasing_backoff
from pyroute2.dhcp.enums import dhcp
from pyroute2.dhcp.leases import Lease
from pyroute2.netlink.exceptions import NetlinkError

from services.prepare.dhcp import DhcpError, DhcpLease, lease_from_reply

log = logging.getLogger("services.prepare.dhcp")

IFF_UP = 0x1

REQUESTED_OPTIONS = (
    dhcp.Option.SUBNET_MASK,
    dhcp.Option.ROUTER,
    dhcp.Option.CLASSLESS_STATIC_ROUTE,
    # pyroute2's client ignores an ACK without a lease time.
    dhcp.Option.LEASE_TIME,
)


class _UnsavedLease(Lease):
    """A lease kept in memory only (pyroute2's default writes <ifname>.lease.json into the
    working directory and reuses it on the next run)."""

    def dump(self) -> None:
        pass

    @classmethod
    def load(cls, interface: str) -> None:
        return None


async def exchange(interface: str, where: str, netns: str | None, timeout_s: float) -> DhcpLease:
    """DISCOVER..ACK on ``interface`` (in the calling thread's netns)."""
    start = time.monotonic()
    await link_up(interface, where)
    config = ClientConfig(
        interface=interface,
        lease_type=_UnsavedLease,
        requested_parameters=REQUESTED_OPTIONS,
        retransmission=functools.partial(randomized_increasing_backoff, wait_first=1.0, wait_max=4.0),
        release=False,  # as dranet: the lease is left to expire
        handle_signals=False,  # the service owns its signals (and this is not the main thread)
        write_pidfile=False,
        vendor_id=None,
        host_name=None,
    )
    try:
        async with AsyncDHCPClient(config) as client:
            await client.bootstrap()
            try:
                await client.wait_for_state(fsm.State.BOUND, timeout=timeout_s)
            except TimeoutError:
                raise DhcpError(
                    f"no DHCP lease on {where} within {timeout_s:g}s "
                    f"(no server answered; client state {client.state.name})"
                ) from None
            ack = client.lease.ack
            lease = lease_from_reply(interface, ack["yiaddr"], ack["options"])
    except DhcpError:
        raise
    except OSError as exc:
        raise DhcpError(f"DHCP on {where}: {exc.strerror or exc}") from None
    log.info(
        "DHCP lease",
        extra={
            "interface": interface,
            "netns": netns or "",
            "address": lease.address,
            "routes": [r.destination for r in lease.routes],
            "server": lease.server_id,
            "lease_time_s": lease.lease_time_s,
            "took_ms": round((time.monotonic() - start) * 1000, 1),
        },
    )
    return lease


async def link_up(interface: str, where: str) -> None:
    """Set the interface up when it is not (as dranet: a DHCP client on a down link
    cannot send)."""
    try:
        async with AsyncIPRoute() as ipr:
            indexes = await ipr.link_lookup(ifname=interface)
            if not indexes:
                raise DhcpError(f"DHCP on {where}: no such interface")
            (msg,) = await ipr.link("get", index=indexes[0])
            if not msg["flags"] & IFF_UP:
                await ipr.link("set", index=indexes[0], state="up")
    except DhcpError:
        raise
    except (OSError, NetlinkError) as exc:
        raise DhcpError(f"DHCP on {where}: setting the link up: {exc}") from None
