"""DHCPv4 for ``interface.dhcp: true``: at Prepare, a DHCP client on the device's host
interface gets a lease, and prepare stores it in the DeviceConfig as the Pod's address
and routes; attach applies them like any configured address and route (dranet
pkg/driver/dhcp.go getDHCP, called from prepareResourceClaim in dra_hooks.go).

Where the exchange runs. The DHCP client must talk on the interface where it is now,
before attach moves it: in the network namespace the inventory discovered it in. In
production the DaemonSet pod is hostNetwork, so prepare, the inventory and the device
share the host's netns and nothing has to move. In the dev harness (dev/cluster/driver.py)
prepare runs in the host's netns while the NICs, the inventory and attach live in the
node's netns. The inventory is not asked to do it: it would need a new RPC, and its
container holds no CAP_NET_RAW. Prepare does it itself, in a fresh thread that
setns()es into ``--device-netns`` (default: prepare's own netns) and runs the client
on an event loop of its own there; setns moves only that thread, which ends with the
exchange, so the service's event loop never changes netns and never blocks (it awaits
a future the thread resolves). This needs CAP_NET_RAW (a packet socket), CAP_NET_ADMIN
(setting the link up, as dranet does) and, only for a foreign netns, CAP_SYS_ADMIN.

Library: pyroute2's DHCP client (imported by the first exchange, services/prepare/dhcp_exchange.py) (``pyroute2.dhcp.client.AsyncDHCPClient``) does the
DISCOVER/OFFER/REQUEST/ACK exchange on a raw socket bound to the interface; the host
interface gets no address. Only option 121's payload is decoded here (RFC 3442
descriptors): pyroute2 0.9.7 has no decoder for it and hands over its raw bytes.

What is taken from the ACK, as dranet does: ``yiaddr`` with the subnet mask (option 1)
as the address, and the classless static routes (option 121) as routes, a route whose
router is 0.0.0.0 being on-link (scope link, no gateway). dranet ignores option 33. Beyond
dranet: option 121 is in our parameter request list (RFC 3442 requires it, and servers
such as dnsmasq send it only when asked; dranet's client does not ask, so it gets those
routes only from servers that send them unasked); when the ACK has no option 121, the
first router of option 3 becomes a default route (RFC 3442: option 3 is ignored when
option 121 is present; dranet drops option 3 always); an ACK without a subnet mask is an
error here (dranet would store an unusable "<nil>" address).

Timeout: dranet bounds the whole exchange with a 5 s context (nclient4 would otherwise
wait 5 s per attempt, 3 attempts); so do we (``DEFAULT_TIMEOUT_S``, prepare's
``--dhcp-timeout``), retransmitting after about 1 s and 2 s inside it.

Release: none, as dranet (nclient4's Close sends no DHCPRELEASE, and Unprepare does not
release either): the lease runs out on the server. The lease is not renewed either: the
Pod keeps the address past the lease time, as with dranet.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shared.netconfig import RouteConfig
from shared.netns import NetnsError, open_netns, setns

log = logging.getLogger(__name__)

# dranet: context.WithTimeout(ctx, 5*time.Second) around getDHCP.
DEFAULT_TIMEOUT_S = 5.0
# How much longer than the exchange's own bound the service waits for its thread.
_THREAD_GRACE_S = 2.0
RT_SCOPE_LINK = 253


class DhcpError(Exception):
    """No usable lease; says which interface, in which netns, and why."""


@dataclass(frozen=True)
class DhcpLease:
    """What prepare stores from one ACK."""

    interface: str
    address: str  # "192.0.2.10/24"
    routes: tuple[RouteConfig, ...] = ()
    server_id: str = ""
    lease_time_s: int | None = None


def classless_static_routes(data: Sequence[int] | bytes) -> list[tuple[ipaddress.IPv4Network, str]]:
    """Option 121 (RFC 3442): (destination, router) pairs. Each descriptor is the prefix
    width, the significant octets of the destination (width/8 rounded up), and the
    router. ValueError when the payload is malformed."""
    raw = bytes(data)
    out: list[tuple[ipaddress.IPv4Network, str]] = []
    i = 0
    while i < len(raw):
        width = raw[i]
        if width > 32:
            raise ValueError(f"option 121: prefix width {width} at byte {i}")
        octets = (width + 7) // 8
        end = i + 1 + octets + 4
        if end > len(raw):
            raise ValueError(f"option 121: descriptor at byte {i} is truncated")
        dest = raw[i + 1 : i + 1 + octets] + bytes(4 - octets)
        router = raw[i + 1 + octets : end]
        # Bits past the width are not part of the destination; the kernel refuses them.
        net = ipaddress.IPv4Network((ipaddress.IPv4Address(dest), width), strict=False)
        out.append((net, str(ipaddress.IPv4Address(router))))
        i = end
    return out


def lease_from_reply(interface: str, yiaddr: str, options: Mapping[str, Any]) -> DhcpLease:
    """The address and routes of an ACK (pyroute2's decoded ``options``). DhcpError when
    the reply gives no usable address."""
    try:
        ip = ipaddress.IPv4Address(yiaddr)
    except ValueError:
        raise DhcpError(f"the DHCP server offered an invalid address {yiaddr!r}") from None
    if int(ip) == 0:
        raise DhcpError("the DHCP ACK has no address (yiaddr 0.0.0.0)")
    mask = options.get("subnet_mask")
    if not mask:
        raise DhcpError(f"the DHCP ACK for {ip} has no subnet mask (option 1)")
    try:
        address = ipaddress.IPv4Interface(f"{ip}/{mask}")
    except ValueError:
        raise DhcpError(f"the DHCP ACK for {ip} has an invalid subnet mask {mask!r}") from None
    routes: list[RouteConfig] = []
    csr = options.get("classless_static_route")
    if csr is not None:
        try:
            pairs = classless_static_routes(csr)
        except (TypeError, ValueError) as exc:
            raise DhcpError(f"the DHCP ACK for {ip} has an invalid option 121: {exc}") from None
        for net, router in pairs:
            if router == "0.0.0.0":
                routes.append(RouteConfig(destination=str(net), scope=RT_SCOPE_LINK))
            else:
                routes.append(RouteConfig(destination=str(net), gateway=router))
    else:
        routers = options.get("router") or []
        if routers:
            routes.append(RouteConfig(destination="0.0.0.0/0", gateway=str(routers[0])))
    lease_time = options.get("lease_time")
    return DhcpLease(
        interface=interface,
        address=address.with_prefixlen,
        routes=tuple(routes),
        server_id=str(options.get("server_id") or ""),
        lease_time_s=int(lease_time) if isinstance(lease_time, int) else None,
    )


# --- the exchange ------------------------------------------------------------------------


class DhcpClient:
    """Leases for host interfaces in the netns ``netns`` (a path such as
    /var/run/netns/<name>; None: this process's own)."""

    def __init__(self, netns: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.netns = netns or None
        self.timeout_s = timeout_s

    def where(self, interface: str) -> str:
        return f"{interface} (netns {self.netns})" if self.netns else interface

    async def lease(self, interface: str) -> DhcpLease:
        """One DISCOVER..ACK on ``interface``, in a fresh thread; DhcpError within about
        ``timeout_s`` when no server answers."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[DhcpLease] = loop.create_future()

        def done(result: DhcpLease | None, exc: BaseException | None) -> None:
            if fut.done():
                return
            if exc is not None:
                fut.set_exception(exc)
            else:
                assert result is not None
                fut.set_result(result)

        def body() -> None:
            try:
                outcome: tuple[DhcpLease | None, BaseException | None] = (
                    self.lease_in_thread(interface),
                    None,
                )
            except BaseException as exc:  # handed to the awaiting coroutine
                outcome = (None, exc)
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                loop.call_soon_threadsafe(done, *outcome)

        threading.Thread(target=body, name=f"dhcp-{interface}", daemon=True).start()
        try:
            return await asyncio.wait_for(asyncio.shield(fut), self.timeout_s + _THREAD_GRACE_S)
        except TimeoutError:
            # Whatever the thread still hands over is dropped (and its error retrieved).
            fut.add_done_callback(lambda f: f.cancelled() or f.exception())
            raise DhcpError(
                f"DHCP on {self.where(interface)} did not finish within {self.timeout_s + _THREAD_GRACE_S:.1f}s"
            ) from None

    def lease_in_thread(self, interface: str) -> DhcpLease:
        """The blocking body: never call it on the service's event loop thread (it may
        setns that thread for good)."""
        if self.netns:
            try:
                fd = open_netns(self.netns)
            except NetnsError as exc:
                raise DhcpError(f"DHCP on {interface}: {exc}") from None
            try:
                setns(fd)
            except NetnsError as exc:
                raise DhcpError(f"DHCP on {interface}: entering {self.netns}: {exc}") from None
            finally:
                os.close(fd)
        return asyncio.run(self._exchange(interface))

    async def _exchange(self, interface: str) -> DhcpLease:
        # pyroute2's DHCP client (and pyroute2, about 24 MiB) is loaded by the first claim
        # that asks for interface.dhcp, not by every prepare process.
        from services.prepare import dhcp_exchange

        return await dhcp_exchange.exchange(interface, self.where(interface), self.netns, self.timeout_s)
