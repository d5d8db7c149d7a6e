"""The node's RDMA network namespace mode (what `rdma system show netns` prints).

Read over RDMA netlink (NETLINK_RDMA, RDMA_NLDEV_CMD_SYS_GET). dranet reads it
once at start and assumes "shared" when the kernel cannot answer (no RDMA
support loaded, old kernel, no permission).
"""

from __future__ import annotations

import logging

from services.inventory import rtnl

log = logging.getLogger(__name__)

SHARED = "shared"
EXCLUSIVE = "exclusive"

RDMA_NL_NLDEV = 5
RDMA_NLDEV_CMD_SYS_GET = 6
RDMA_NLDEV_SYS_ATTR_NETNS_MODE = 66


def netns_mode_from_attr(value: int) -> str:
    """ib_core netns_mode: 1 is shared, 0 exclusive."""
    return SHARED if value else EXCLUSIVE


def read_netns_mode() -> str:
    """ "shared" or "exclusive"; "shared" when the kernel does not say. Blocking."""
    try:
        with rtnl.Netlink(rtnl.NETLINK_RDMA) as nl:
            msg_type = (RDMA_NL_NLDEV << 10) + RDMA_NLDEV_CMD_SYS_GET
            for _mtype, _flags, body in nl.messages(msg_type, rtnl.NLM_F_REQUEST | rtnl.NLM_F_ACK, b""):
                attrs = rtnl.parse_attrs(body, 0, len(body))
                value = attrs.get(RDMA_NLDEV_SYS_ATTR_NETNS_MODE)
                if value is not None and len(value) >= 1:
                    mode = netns_mode_from_attr(value[0])
                    log.info("RDMA subsystem netns mode", extra={"mode": mode})
                    return mode
    except OSError as exc:
        log.info("cannot read the RDMA netns mode, assuming shared: %s", exc)
        return SHARED
    log.info("the kernel did not report an RDMA netns mode, assuming shared")
    return SHARED
