"""rtnetlink (and RDMA netlink) for the services that talk to the kernel directly.

``codec`` is the wire format, pure (constants, fixed headers, attribute TLVs,
message framing); ``sock`` is the one small blocking socket both inventory and
attach use. What each service asks and how it reads the answers into its own
types stays in the service (services/inventory/rtnl.py, services/attach/netdev_nl.py).
"""
