"""What attach does to a device, as data: the plan for RunPodSandbox, its rollback, the
return plan for StopPodSandbox, and the RDMA device files for CreateContainer.

Pure: no I/O. The attach service observes the host and the pod netns (LinkState),
asks for a plan here, and applies it in one place (services/attach/netdev.py).

Models (dranet v1.5 "Passthrough or IPvlan child", "RDMA modes"):

- passthrough: the whole netdev moves into the pod netns and is renamed in one
  RTM_NEWLINK that also sets MTU, MAC and the GSO/GRO sizes; then the per-interface
  sysctls, addresses, link up, VRF, routes, rules, permanent neighbors, ethtool and
  eBPF detach. It returns under its host name and is set up; its host addresses are
  not restored (as dranet).
- IPvlan child: created on the parent directly inside the pod netns (mode l2);
  deleted on return.
- RDMA exclusive mode: the RDMA link device moves into the pod after the netdev and
  returns before it.

Every device carries an altname tag (``altname_for``) while it is away from the host,
so it is found after a move even if someone in the pod renamed it.

One module (over 800 lines) because the observations, the step types and the planners are one
vocabulary: each planner builds most of the step types, and the rollback and return plans are
made by inverting steps of the attach plan, so splitting it would only spread one data model
over several imports.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypeVar

from proto.dranet.store.v1 import store_pb2
from shared.netconfig import Addressing, ConfigError, InterfaceType, NetworkConfig, parse_network_config
from shared.netconfig.validate import interface_name_problem, vrf_table_for

T = TypeVar("T", int, str)

RT_TABLE_MAIN = 254
RT_SCOPE_LINK = 253
ALTNAME_PREFIX = "dranet-"
# IPvlan mode dranet uses (netlink.IPVLAN_MODE_L2); NetworkConfig has no field for it.
IPVLAN_MODE_L2 = "l2"

# Condition types and reasons as dranet sets them on the claim's device status.
READY = "Ready"
NETWORK_READY = "NetworkReady"
RDMA_LINK_READY = "RDMALinkReady"
REASON_NETWORK_DEVICE_READY = "NetworkDeviceReady"
REASON_RDMA_ONLY_DEVICE_READY = "RDMAOnlyDeviceReady"


class PlanError(ValueError):
    """The device cannot be attached or returned as configured; says which and why."""


class Ns(StrEnum):
    """Which network namespace a step runs in."""

    HOST = "host"
    POD = "pod"


class DeviceKind(StrEnum):
    PASSTHROUGH = "passthrough"
    IPVLAN = "ipvlan"
    RDMA_ONLY = "rdma-only"


def altname_for(host_ifname: str) -> str:
    """The altname that tags a device dranet moved, e.g. ``dranet-eth1``. Altnames move
    with the device between netns (kernel >= 6.8 checks them for clashes too)."""
    return ALTNAME_PREFIX + host_ifname


# --- observed state (the executor fills these in) ------------------------------------


@dataclass(frozen=True)
class LinkState:
    """One link as RTM_GETLINK reported it."""

    name: str
    index: int
    mac: str = ""
    mtu: int = 0
    up: bool = False
    kind: str = ""
    altnames: tuple[str, ...] = ()
    perm_mac: str = ""
    master: int = 0
    # IFLA_LINK: the parent's ifindex (in the parent's netns) for an ipvlan child.
    link: int = 0
    gso_max_size: int | None = None
    gro_max_size: int | None = None
    gso_ipv4_max_size: int | None = None
    gro_ipv4_max_size: int | None = None


@dataclass(frozen=True)
class AttachObservation:
    """Where things stand before an attach.

    on_host: the passthrough device (found by host name or by its altname tag) or the
    IPvlan parent. in_pod: our device already in the pod (tagged), or an IPvlan child
    of the parent with the pod name. pod_name_taken: a link in the pod that holds the
    pod-side name but is not ours.
    """

    on_host: LinkState | None = None
    in_pod: LinkState | None = None
    pod_name_taken: LinkState | None = None


@dataclass(frozen=True)
class ReturnObservation:
    """Where things stand before a return. netns_exists is False when the pod netns
    path no longer opens (the pod's netns is gone)."""

    netns_exists: bool
    in_pod: LinkState | None = None
    on_host: LinkState | None = None


# --- steps -----------------------------------------------------------------------------


@dataclass(frozen=True)
class LinkAttrs:
    """Link attributes that go in one RTM_NEWLINK. None = leave as is."""

    mtu: int | None = None
    mac: str | None = None
    gso_max_size: int | None = None
    gro_max_size: int | None = None
    gso_ipv4_max_size: int | None = None
    gro_ipv4_max_size: int | None = None

    def any(self) -> bool:
        return any(v is not None for v in self._items())

    def _items(self) -> tuple[int | str | None, ...]:
        return (
            self.mtu,
            self.mac,
            self.gso_max_size,
            self.gro_max_size,
            self.gso_ipv4_max_size,
            self.gro_ipv4_max_size,
        )

    def describe(self) -> str:
        # Named as the claim's config names them: a kernel refusal then points at the field.
        names = (
            "interface.mtu",
            "interface.hardwareAddr",
            "interface.gsoMaxSize",
            "interface.groMaxSize",
            "interface.gsoIPv4MaxSize",
            "interface.groIPv4MaxSize",
        )
        return ", ".join(f"{n} {v}" for n, v in zip(names, self._items(), strict=True) if v is not None)

    def original(self, link: LinkState | None, host: NetworkConfig | None = None) -> LinkAttrs:
        """The values these attributes had on ``link`` (else in the host snapshot), for
        the ones this would change: what an undo sets back. Unknown ones stay None."""
        itf = host.interface if host is not None else None
        return LinkAttrs(
            mtu=_was(self.mtu, link.mtu if link else None, itf.mtu if itf else None),
            mac=_was(self.mac, link.mac if link else None, itf.hardware_addr if itf else None),
            gso_max_size=_was(self.gso_max_size, link.gso_max_size if link else None),
            gro_max_size=_was(self.gro_max_size, link.gro_max_size if link else None),
            gso_ipv4_max_size=_was(self.gso_ipv4_max_size, link.gso_ipv4_max_size if link else None),
            gro_ipv4_max_size=_was(self.gro_ipv4_max_size, link.gro_ipv4_max_size if link else None),
        )


def _was(mine: T | None, seen: T | None, snapshot: T | None = None) -> T | None:
    if mine is None:
        return None
    for value in (seen, snapshot):
        if value not in (None, "", 0):
            return value
    return None


@dataclass(frozen=True)
class LinkLocator:
    """How to find a link in one netns: each name in turn, then the altname tag, then
    the MAC (a dump; last resort)."""

    names: tuple[str, ...]
    altname: str = ""
    mac: str = ""

    def describe(self) -> str:
        alts = [n for n in self.names[1:]]
        if self.altname:
            alts.append(f"altname {self.altname}")
        if self.mac:
            alts.append(f"MAC {self.mac}")
        first = self.names[0] if self.names else "?"
        return f"{first} (or {', '.join(alts)})" if alts else first


class Step:
    """One thing to do in one netns. Subclasses are frozen dataclasses."""

    ns: Ns

    def describe(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True)
class AddAltname(Step):
    ns: Ns
    ifname: str
    altname: str

    def describe(self) -> str:
        return f"tag {self.ifname} with altname {self.altname} in {self.ns} netns"


@dataclass(frozen=True)
class DelAltname(Step):
    ns: Ns
    ifname: str
    altname: str

    def describe(self) -> str:
        return f"remove altname {self.altname} from {self.ifname} in {self.ns} netns"


@dataclass(frozen=True)
class MoveLink(Step):
    """Move a link to the other netns and rename it there, setting ``attrs`` in the
    same RTM_NEWLINK. The kernel downs a link when it changes netns."""

    ns: Ns  # source
    dst: Ns
    locator: LinkLocator
    new_name: str
    attrs: LinkAttrs = field(default_factory=LinkAttrs)

    def describe(self) -> str:
        extra = f" with {self.attrs.describe()}" if self.attrs.any() else ""
        return f"move {self.locator.describe()} from {self.ns} netns to {self.dst} netns as {self.new_name}{extra}"


@dataclass(frozen=True)
class RenameLink(Step):
    """Rename in place (the executor sets the link down first: the kernel refuses to
    rename a running link)."""

    ns: Ns
    ifname: str
    new_name: str

    def describe(self) -> str:
        return f"rename {self.ifname} to {self.new_name} in {self.ns} netns"


@dataclass(frozen=True)
class SetLink(Step):
    ns: Ns
    ifname: str
    attrs: LinkAttrs

    def describe(self) -> str:
        return f"set {self.attrs.describe()} on {self.ifname} in {self.ns} netns"


@dataclass(frozen=True)
class SetLinkState(Step):
    ns: Ns
    ifname: str
    up: bool

    def describe(self) -> str:
        return f"set {self.ifname} {'up' if self.up else 'down'} in {self.ns} netns"


@dataclass(frozen=True)
class WriteSysctl(Step):
    """Write /proc/sys/<key> as seen from the netns. missing_ok: a key that does not
    exist is not an error (IPv6 disabled)."""

    ns: Ns
    key: str
    value: str
    missing_ok: bool = False

    def describe(self) -> str:
        return f"set sysctl {self.key.replace('/', '.')}={self.value} in {self.ns} netns"


@dataclass(frozen=True)
class AddAddress(Step):
    ns: Ns
    ifname: str
    cidr: str

    def describe(self) -> str:
        return f"add address {self.cidr} to {self.ifname} in {self.ns} netns"


@dataclass(frozen=True)
class AddRoute(Step):
    ns: Ns
    ifname: str
    destination: str
    gateway: str = ""
    source: str = ""
    scope: int = 0
    table: int = RT_TABLE_MAIN

    def describe(self) -> str:
        text = f"add route {self.destination}"
        if self.gateway:
            text += f" via {self.gateway}"
        text += f" dev {self.ifname}"
        if self.source:
            text += f" src {self.source}"
        if self.scope:
            text += f" scope {self.scope}"
        if self.table != RT_TABLE_MAIN:
            text += f" table {self.table}"
        return text + f" in {self.ns} netns"


@dataclass(frozen=True)
class AddRule(Step):
    ns: Ns
    priority: int
    source: str
    destination: str
    table: int

    def describe(self) -> str:
        return f"add rule {_rule_text(self)} in {self.ns} netns"


@dataclass(frozen=True)
class DelRule(Step):
    ns: Ns
    priority: int
    source: str
    destination: str
    table: int

    def describe(self) -> str:
        return f"delete rule {_rule_text(self)} in {self.ns} netns"


def _rule_text(r: AddRule | DelRule) -> str:
    parts = [f"priority {r.priority}"]
    if r.source:
        parts.append(f"from {r.source}")
    if r.destination:
        parts.append(f"to {r.destination}")
    parts.append(f"lookup {r.table}")
    return " ".join(parts)


@dataclass(frozen=True)
class AddNeighbor(Step):
    """A permanent neighbor entry (replaces an existing one for the same address)."""

    ns: Ns
    ifname: str
    destination: str
    mac: str

    def describe(self) -> str:
        return f"add permanent neighbor {self.destination} lladdr {self.mac} dev {self.ifname} in {self.ns} netns"


@dataclass(frozen=True)
class CreateVrf(Step):
    ns: Ns
    name: str
    table: int

    def describe(self) -> str:
        return f"create VRF {self.name} table {self.table} in {self.ns} netns"


@dataclass(frozen=True)
class SetMaster(Step):
    ns: Ns
    ifname: str
    master: str

    def describe(self) -> str:
        return f"enslave {self.ifname} to {self.master} in {self.ns} netns"


@dataclass(frozen=True)
class DeleteLink(Step):
    ns: Ns
    ifname: str

    def describe(self) -> str:
        return f"delete link {self.ifname} in {self.ns} netns"


@dataclass(frozen=True)
class CreateChild(Step):
    """Create a child link (ipvlan) of a host parent directly inside the pod netns."""

    ns: Ns  # where the child goes (the pod)
    parent: str  # in the host netns
    name: str
    kind: str = "ipvlan"
    mode: str = IPVLAN_MODE_L2
    mtu: int | None = None

    def describe(self) -> str:
        mtu = f" mtu {self.mtu}" if self.mtu else ""
        return f"create {self.kind} child {self.name} of host {self.parent} (mode {self.mode}{mtu}) in {self.ns} netns"


@dataclass(frozen=True)
class ApplyEthtool(Step):
    ns: Ns
    ifname: str
    features: tuple[tuple[str, bool], ...] = ()
    private_flags: tuple[tuple[str, bool], ...] = ()

    def describe(self) -> str:
        parts = [f"{k} {'on' if v else 'off'}" for k, v in self.features]
        parts += [f"private flag {k} {'on' if v else 'off'}" for k, v in self.private_flags]
        return f"ethtool {self.ifname}: {', '.join(parts)} in {self.ns} netns"


@dataclass(frozen=True)
class DetachEbpf(Step):
    """Remove eBPF tc filters (clsact ingress/egress) and TCX programs and links."""

    ns: Ns
    ifname: str

    def describe(self) -> str:
        return f"detach eBPF programs (tc bpf filters, TCX) from {self.ifname} in {self.ns} netns"


@dataclass(frozen=True)
class MoveRdmaLink(Step):
    """Move an RDMA link device (e.g. mlx5_0) to the other netns (RDMA netlink,
    exclusive netns mode only)."""

    ns: Ns  # source
    dst: Ns
    name: str

    def describe(self) -> str:
        return f"move RDMA device {self.name} from {self.ns} netns to {self.dst} netns"


@dataclass(frozen=True)
class PlannedStep:
    """A step and what undoes it if a later step fails. An empty undo means the step
    needs none (its effect leaves the pod with the device, e.g. addresses)."""

    action: Step
    undo: tuple[Step, ...] = ()
    # The claim config field the step comes from ("routes[0]"), named when the kernel refuses it.
    origin: str = ""


# --- conditions and device spec ------------------------------------------------------


@dataclass(frozen=True)
class Condition:
    type: str
    status: str
    reason: str
    message: str = ""


@dataclass(frozen=True)
class DeviceNode:
    """A device file for the pod's containers (NRI LinuxDevice). None = unset."""

    path: str
    type: str
    major: int
    minor: int
    file_mode: int | None = None
    uid: int | None = None
    gid: int | None = None


@dataclass(frozen=True)
class DeviceSpec:
    """A DeviceConfig in the form the planner uses."""

    device: str
    pod_uid: str
    kind: DeviceKind
    host_ifname: str
    pod_ifname: str
    pod: NetworkConfig
    host: NetworkConfig | None = None
    rdma_link_dev: str = ""
    rdma_dev_chars: tuple[DeviceNode, ...] = ()
    rdma_exclusive: bool = False

    @property
    def altname(self) -> str:
        return altname_for(self.host_ifname) if self.host_ifname else ""

    @staticmethod
    def from_proto(cfg: store_pb2.DeviceConfig) -> DeviceSpec:
        """Parse a stored DeviceConfig. PlanError names the device and the field."""
        try:
            pod = parse_network_config(cfg.pod_config_json) or NetworkConfig()
        except ConfigError as exc:
            raise PlanError(f"device {cfg.device}: pod_config_json: {exc}") from None
        try:
            host = parse_network_config(cfg.host_config_json)
        except ConfigError:
            # Only a rollback reads it (to restore host addresses): never block an attach on it.
            host = None
        host_ifname = cfg.host_ifname or (host.interface.name if host else "")
        # These names become netlink names and /proc/sys/net/*/conf/<name>/ paths: a
        # record that did not come through prepare's validation must not escape them.
        vrf = pod.interface.vrf.name if pod.interface.vrf else ""
        for what, name in (
            ("host_ifname", host_ifname),
            ("pod_config_json interface.name", pod.interface.name),
            ("pod_config_json interface.vrf.name", vrf),
        ):
            problem = interface_name_problem(name) if name else None
            if problem:
                raise PlanError(f"device {cfg.device}: {what}: {name!r} {problem}")
        if not host_ifname:
            kind = DeviceKind.RDMA_ONLY
        elif pod.interface.effective_type == InterfaceType.IPVLAN:
            kind = DeviceKind.IPVLAN
        else:
            kind = DeviceKind.PASSTHROUGH
        return DeviceSpec(
            device=cfg.device,
            pod_uid=cfg.pod.uid,
            kind=kind,
            host_ifname=host_ifname,
            pod_ifname=(pod.interface.name or host_ifname) if host_ifname else "",
            pod=pod,
            host=host,
            rdma_link_dev=cfg.rdma.link_dev,
            rdma_dev_chars=tuple(_node(d) for d in cfg.rdma.dev_chars),
            rdma_exclusive=cfg.rdma_netns_mode == "exclusive",
        )


def _node(d: store_pb2.LinuxDevice) -> DeviceNode:
    # proto3 has no presence for scalars: 0 means "not recorded", so the runtime default applies.
    return DeviceNode(
        path=d.path,
        type=d.type or "c",
        major=d.major,
        minor=d.minor,
        file_mode=d.file_mode or None,
        uid=d.uid or None,
        gid=d.gid or None,
    )


# --- attach plan -----------------------------------------------------------------------


@dataclass(frozen=True)
class AttachPlan:
    """Ordered steps for one device into one pod netns.

    base_undo runs on rollback after the undos of the steps that were done (a
    converging plan found the device already in the pod and still gives it back);
    restore runs last when the device went back to the host (beyond dranet: its host
    addresses, routes and permanent neighbors from host_config_json, because a device
    that failed to attach never served the pod).
    """

    device: str
    kind: DeviceKind
    host_ifname: str
    pod_ifname: str
    netns: str
    steps: tuple[PlannedStep, ...]
    ips: tuple[str, ...] = ()
    mac: str = ""
    conditions: tuple[Condition, ...] = ()
    converging: bool = False
    base_undo: tuple[Step, ...] = ()
    restore: tuple[Step, ...] = ()

    def describe(self) -> list[str]:
        return [s.action.describe() for s in self.steps]


def plan_attach(spec: DeviceSpec, netns: str, seen: AttachObservation) -> AttachPlan:
    """The steps that put ``spec``'s device into the pod netns ``netns``, given what
    the executor saw. Raises PlanError when it cannot be done as configured."""
    if spec.kind == DeviceKind.RDMA_ONLY:
        return _plan_rdma_only(spec, netns)
    itf = spec.pod.interface
    if itf.dhcp and not itf.addresses:
        # Prepare stores the lease as interface.addresses (services/prepare/dhcp.py); a
        # record without one was not prepared by it: never start the Pod unaddressed.
        raise PlanError(
            f"device {spec.device}: interface.dhcp is set but the stored config holds no "
            "leased address (prepare stores the DHCP lease as interface.addresses)"
        )
    if spec.kind == DeviceKind.IPVLAN:
        return _plan_ipvlan(spec, netns, seen)
    return _plan_passthrough(spec, netns, seen)


def _conditions(spec: DeviceSpec) -> tuple[Condition, ...]:
    out = [
        Condition(READY, "True", REASON_NETWORK_DEVICE_READY),
        Condition(NETWORK_READY, "True", NETWORK_READY),
    ]
    if spec.rdma_exclusive and spec.rdma_link_dev:
        out.append(Condition(RDMA_LINK_READY, "True", RDMA_LINK_READY))
    return tuple(out)


def _rdma_steps(spec: DeviceSpec) -> list[PlannedStep]:
    if not (spec.rdma_exclusive and spec.rdma_link_dev):
        return []
    return [
        PlannedStep(
            MoveRdmaLink(Ns.HOST, Ns.POD, spec.rdma_link_dev),
            undo=(MoveRdmaLink(Ns.POD, Ns.HOST, spec.rdma_link_dev),),
        )
    ]


def _plan_rdma_only(spec: DeviceSpec, netns: str) -> AttachPlan:
    conditions = []
    if spec.rdma_exclusive and spec.rdma_link_dev:
        conditions.append(Condition(RDMA_LINK_READY, "True", RDMA_LINK_READY))
    conditions.append(Condition(READY, "True", REASON_RDMA_ONLY_DEVICE_READY))
    return AttachPlan(
        device=spec.device,
        kind=spec.kind,
        host_ifname="",
        pod_ifname="",
        netns=netns,
        steps=tuple(_rdma_steps(spec)),
        conditions=tuple(conditions),
    )


def _link_attrs(spec: DeviceSpec) -> LinkAttrs:
    itf = spec.pod.interface
    return LinkAttrs(
        mtu=itf.mtu,
        mac=itf.hardware_addr,
        gso_max_size=itf.gso_max_size,
        gro_max_size=itf.gro_max_size,
        gso_ipv4_max_size=itf.gso_ipv4_max_size,
        gro_ipv4_max_size=itf.gro_ipv4_max_size,
    )


def _addresses(spec: DeviceSpec) -> tuple[str, ...]:
    itf = spec.pod.interface
    if itf.addressing == Addressing.UNNUMBERED:
        return ()
    return tuple(itf.addresses)


def _in_pod_steps(spec: DeviceSpec, ips: Sequence[str]) -> list[PlannedStep]:
    """Everything after the link is in the pod under its final name."""
    name = spec.pod_ifname
    itf = spec.pod.interface
    steps: list[PlannedStep] = []
    # Sysctls before the addresses and link up, so the link never answers ARP with
    # the wrong policy. They live with the device: a move out resets them.
    if itf.forwarding:
        steps.append(PlannedStep(WriteSysctl(Ns.POD, f"net/ipv4/conf/{name}/forwarding", "1")))
        steps.append(
            PlannedStep(WriteSysctl(Ns.POD, f"net/ipv6/conf/{name}/forwarding", "1", missing_ok=True))
        )
    if itf.arp_ignore is not None:
        steps.append(
            PlannedStep(
                WriteSysctl(Ns.POD, f"net/ipv4/conf/{name}/arp_ignore", str(itf.arp_ignore)),
                origin="interface.arpIgnore",
            )
        )
    if itf.arp_announce is not None:
        steps.append(
            PlannedStep(
                WriteSysctl(Ns.POD, f"net/ipv4/conf/{name}/arp_announce", str(itf.arp_announce)),
                origin="interface.arpAnnounce",
            )
        )
    steps += [PlannedStep(AddAddress(Ns.POD, name, cidr), origin="interface.addresses") for cidr in ips]
    steps.append(PlannedStep(SetLinkState(Ns.POD, name, up=True)))
    cfg = spec.pod
    if cfg.ethtool is not None and (cfg.ethtool.features or cfg.ethtool.private_flags):
        # The executor records the previous values and returns the undo it needs.
        steps.append(
            PlannedStep(
                ApplyEthtool(
                    Ns.POD,
                    name,
                    tuple(sorted(cfg.ethtool.features.items())),
                    tuple(sorted(cfg.ethtool.private_flags.items())),
                ),
                origin="ethtool",
            )
        )
    if itf.disable_ebpf_programs:
        steps.append(PlannedStep(DetachEbpf(Ns.POD, name)))
    vrf_table = 0
    if itf.vrf is not None and itf.vrf.name:
        vrf_table = itf.vrf.table or vrf_table_for(itf.vrf.name)
        steps.append(
            PlannedStep(
                CreateVrf(Ns.POD, itf.vrf.name, vrf_table),
                undo=(DeleteLink(Ns.POD, itf.vrf.name),),
                origin="interface.vrf",
            )
        )
        steps.append(PlannedStep(SetLinkState(Ns.POD, itf.vrf.name, up=True)))
        steps.append(PlannedStep(SetMaster(Ns.POD, name, itf.vrf.name)))
        steps.append(PlannedStep(WriteSysctl(Ns.POD, "net/ipv4/tcp_l3mdev_accept", "1")))
        steps.append(PlannedStep(WriteSysctl(Ns.POD, "net/ipv4/udp_l3mdev_accept", "1")))
    # Link-scope routes first: a universe route's gateway may be reachable only
    # through one of them (e.g. a /32 address with its gateway as a link route).
    for i, r in sorted(enumerate(cfg.routes), key=lambda ir: -ir[1].scope):
        table = vrf_table or r.table or RT_TABLE_MAIN
        steps.append(
            PlannedStep(
                AddRoute(Ns.POD, name, r.destination, r.gateway, r.source, r.scope, table),
                origin=f"routes[{i}]",
            )
        )
    if not vrf_table:
        # With a VRF the l3mdev rule does the table lookup; dranet adds no rules then.
        for i, rule in enumerate(cfg.rules):
            table = rule.table or RT_TABLE_MAIN
            steps.append(
                PlannedStep(
                    AddRule(Ns.POD, rule.priority, rule.source, rule.destination, table),
                    undo=(DelRule(Ns.POD, rule.priority, rule.source, rule.destination, table),),
                    origin=f"rules[{i}]",
                )
            )
    steps += [
        PlannedStep(AddNeighbor(Ns.POD, name, n.destination, n.hardware_addr), origin=f"neighbors[{i}]")
        for i, n in enumerate(cfg.neighbors)
    ]
    return steps


def _host_restore(spec: DeviceSpec) -> tuple[Step, ...]:
    """Host addresses, routes and permanent neighbors from the host snapshot."""
    host = spec.host
    if host is None:
        return ()
    name = spec.host_ifname
    out: list[Step] = [AddAddress(Ns.HOST, name, a) for a in host.interface.addresses]
    for r in sorted(host.routes, key=lambda r: -r.scope):
        out.append(
            AddRoute(Ns.HOST, name, r.destination, r.gateway, r.source, r.scope, r.table or RT_TABLE_MAIN)
        )
    out += [AddNeighbor(Ns.HOST, name, n.destination, n.hardware_addr) for n in host.neighbors]
    return tuple(out)


def _netdev_plan(
    spec: DeviceSpec,
    netns: str,
    steps: list[PlannedStep],
    ips: tuple[str, ...],
    mac: str,
    *,
    converging: bool = False,
    base_undo: tuple[Step, ...] = (),
    restore: tuple[Step, ...] = (),
) -> AttachPlan:
    """The plan of a device that has a netdev in the pod (passthrough or IPvlan child)."""
    return AttachPlan(
        device=spec.device,
        kind=spec.kind,
        host_ifname=spec.host_ifname,
        pod_ifname=spec.pod_ifname,
        netns=netns,
        steps=tuple(steps),
        ips=ips,
        mac=mac,
        conditions=_conditions(spec),
        converging=converging,
        base_undo=base_undo,
        restore=restore,
    )


def _plan_passthrough(spec: DeviceSpec, netns: str, seen: AttachObservation) -> AttachPlan:
    attrs = _link_attrs(spec)
    ips = _addresses(spec)
    tag = spec.altname
    where = f"device {spec.device} (host {spec.host_ifname}, pod {spec.pod_ifname}, netns {netns})"
    steps: list[PlannedStep] = []
    if seen.in_pod is not None:
        # Already in this pod (a retried RunPodSandbox): converge. If this attach
        # fails, the device still goes back to the host.
        cur = seen.in_pod
        if cur.name != spec.pod_ifname:
            if seen.pod_name_taken is not None:
                raise PlanError(
                    f"{where}: the pod netns already has another interface named {spec.pod_ifname}"
                )
            steps.append(PlannedStep(RenameLink(Ns.POD, cur.name, spec.pod_ifname)))
        if attrs.any():
            steps.append(PlannedStep(SetLink(Ns.POD, spec.pod_ifname, attrs)))
        steps += _in_pod_steps(spec, ips)
        steps += _rdma_steps(spec)
        before = attrs.original(None, spec.host)
        locator = LinkLocator((spec.pod_ifname, cur.name), tag, attrs.mac or cur.mac)
        return _netdev_plan(
            spec,
            netns,
            steps,
            ips,
            attrs.mac or cur.mac,
            converging=True,
            base_undo=(
                MoveLink(Ns.POD, Ns.HOST, locator, spec.host_ifname, before),
                SetLinkState(Ns.HOST, spec.host_ifname, up=True),
                DelAltname(Ns.HOST, spec.host_ifname, tag),
            ),
            restore=_host_restore(spec),
        )
    host = seen.on_host
    if host is None:
        raise PlanError(f"{where}: not found in the host netns nor in the pod netns")
    if seen.pod_name_taken is not None:
        raise PlanError(f"{where}: the pod netns already has an interface named {spec.pod_ifname}")
    if tag not in host.altnames:
        steps.append(
            PlannedStep(
                AddAltname(Ns.HOST, host.name, tag), undo=(DelAltname(Ns.HOST, spec.host_ifname, tag),)
            )
        )
    final_mac = attrs.mac or host.mac
    back = LinkLocator((spec.pod_ifname, host.name), tag, final_mac)
    steps.append(
        PlannedStep(
            MoveLink(Ns.HOST, Ns.POD, LinkLocator((host.name,), tag), spec.pod_ifname, attrs),
            undo=(
                MoveLink(Ns.POD, Ns.HOST, back, spec.host_ifname, attrs.original(host, spec.host)),
                SetLinkState(Ns.HOST, spec.host_ifname, up=host.up),
            ),
        )
    )
    steps += _in_pod_steps(spec, ips)
    steps += _rdma_steps(spec)
    return _netdev_plan(spec, netns, steps, ips, final_mac, restore=_host_restore(spec))


def _plan_ipvlan(spec: DeviceSpec, netns: str, seen: AttachObservation) -> AttachPlan:
    itf = spec.pod.interface
    where = f"device {spec.device} (IPvlan child {spec.pod_ifname} of host {spec.host_ifname}, netns {netns})"
    parent = seen.on_host
    if parent is None:
        raise PlanError(f"{where}: parent interface {spec.host_ifname} not found in the host netns")
    if spec.rdma_exclusive:
        raise PlanError(f"{where}: IPvlan children cannot be used in RDMA exclusive netns mode")
    if itf.hardware_addr is not None:
        raise PlanError(f"{where}: interface.hardwareAddr cannot be set (the child uses the parent's MAC)")
    if itf.mtu is not None and parent.mtu and itf.mtu > parent.mtu:
        raise PlanError(f"{where}: interface.mtu {itf.mtu} exceeds the parent's MTU {parent.mtu}")
    ips = _addresses(spec)
    if spec.host is not None:
        own = {_ip_of(a) for a in spec.host.interface.addresses}
        clash = [a for a in ips if _ip_of(a) in own]
        if clash:
            raise PlanError(f"{where}: address {clash[0]} is the parent's own host address")
    if seen.pod_name_taken is not None:
        raise PlanError(f"{where}: the pod netns already has an interface named {spec.pod_ifname}")
    steps: list[PlannedStep] = []
    converging = seen.in_pod is not None
    if not converging:
        steps.append(
            PlannedStep(
                CreateChild(Ns.POD, parent.name, spec.pod_ifname, "ipvlan", IPVLAN_MODE_L2, itf.mtu),
                undo=(DeleteLink(Ns.POD, spec.pod_ifname),),
            )
        )
    elif itf.mtu is not None:
        steps.append(PlannedStep(SetLink(Ns.POD, spec.pod_ifname, LinkAttrs(mtu=itf.mtu))))
    steps += _in_pod_steps(spec, ips)
    return _netdev_plan(
        spec,
        netns,
        steps,
        ips,
        parent.mac,
        converging=converging,
        base_undo=(DeleteLink(Ns.POD, spec.pod_ifname),) if converging else (),
    )


def _ip_of(cidr: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_interface(cidr).ip
    except ValueError:
        return None


def plan_rollback(
    plan: AttachPlan, done: Collection[int], extra_undo: dict[int, tuple[Step, ...]] | None = None
) -> tuple[Step, ...]:
    """What undoes a half-done ``plan``: the undos of the steps in ``done`` (indexes
    into plan.steps), last first, then base_undo, then the host restore if the device
    went back to the host. ``extra_undo`` replaces a step's planned undo with one the
    executor computed while applying it (ethtool's previous values)."""
    extra_undo = extra_undo or {}
    out: list[Step] = []
    moved = plan.converging
    for i in sorted(done, reverse=True):
        ps = plan.steps[i]
        out += extra_undo.get(i, ps.undo)
        if isinstance(ps.action, MoveLink) and ps.action.ns == Ns.HOST:
            moved = True
    out += plan.base_undo
    if moved and plan.kind == DeviceKind.PASSTHROUGH:
        out += plan.restore
    return tuple(out)


# --- return plan -----------------------------------------------------------------------


class ReturnState(StrEnum):
    RETURNED = "returned"  # moved back to the host (or the IPvlan child deleted)
    ALREADY_ON_HOST = "already-on-host"  # nothing to do: on the host (maybe never attached)
    RECLAIMED = "reclaimed"  # came back by itself (netns teardown): renamed and set up
    GONE = "gone"  # neither in the pod nor on the host
    NOTHING = "nothing"  # RDMA-only in shared mode: no link to return


@dataclass(frozen=True)
class ReturnTarget:
    """What is needed to give a device back. kind None: infer from what is in the pod
    (an AttachResult alone does not say)."""

    device: str
    host_ifname: str
    pod_ifname: str
    kind: DeviceKind | None = None
    mac: str = ""
    rdma_link_dev: str = ""
    rdma_exclusive: bool = False

    @property
    def altname(self) -> str:
        return altname_for(self.host_ifname) if self.host_ifname else ""

    def locator(self) -> LinkLocator:
        names = tuple(dict.fromkeys(n for n in (self.pod_ifname, self.host_ifname) if n))
        return LinkLocator(names, self.altname, self.mac)

    @staticmethod
    def from_spec(spec: DeviceSpec, mac: str = "") -> ReturnTarget:
        return ReturnTarget(
            device=spec.device,
            host_ifname=spec.host_ifname,
            pod_ifname=spec.pod_ifname,
            kind=spec.kind,
            mac=mac,
            rdma_link_dev=spec.rdma_link_dev,
            rdma_exclusive=spec.rdma_exclusive,
        )

    @staticmethod
    def from_result(result: store_pb2.AttachResult) -> ReturnTarget:
        """From what attach recorded (the DeviceConfig may be gone already)."""
        return ReturnTarget(
            device=result.device,
            host_ifname=result.host_ifname,
            pod_ifname=result.interface_name or result.host_ifname,
            kind=None if result.host_ifname else DeviceKind.RDMA_ONLY,
            mac=result.hardware_address,
        )


@dataclass(frozen=True)
class ReturnPlan:
    """RDMA link first (its failure does not stop the netdev), then the netdev."""

    target: ReturnTarget
    rdma_steps: tuple[Step, ...]
    netdev_steps: tuple[Step, ...]
    state: ReturnState
    note: str = ""


_GONE_NOTE = (
    "the pod netns is gone and the device is not on the host: a virtual device (veth, "
    "ipvlan) is destroyed with its netns; a physical NIC or VF returns to the host netns "
    "by itself when the netns is finally freed (under its pod-side name, down), and a "
    "later return or attach finds it by its altname"
)


def plan_return(target: ReturnTarget, seen: ReturnObservation) -> ReturnPlan:
    """The steps that give ``target`` back to the host, given what the executor saw."""
    rdma: tuple[Step, ...] = ()
    if target.rdma_exclusive and target.rdma_link_dev and seen.netns_exists:
        # Without the netns, ib_core has already moved the RDMA device to init_net.
        rdma = (MoveRdmaLink(Ns.POD, Ns.HOST, target.rdma_link_dev),)
    if target.kind == DeviceKind.RDMA_ONLY or not target.host_ifname:
        state = ReturnState.RETURNED if rdma else ReturnState.NOTHING
        return ReturnPlan(target, rdma, (), state)
    tag = target.altname
    kind = target.kind
    if seen.in_pod is not None and seen.in_pod.kind == "ipvlan" and tag not in seen.in_pod.altnames:
        # A device we moved carries the tag; an untagged ipvlan link under the pod
        # name is the child we created (a config rebuilt from an AttachResult does
        # not say which model it was).
        kind = DeviceKind.IPVLAN
    elif kind is None:
        kind = DeviceKind.PASSTHROUGH
    if kind == DeviceKind.IPVLAN:
        if seen.in_pod is not None:
            return ReturnPlan(target, rdma, (DeleteLink(Ns.POD, seen.in_pod.name),), ReturnState.RETURNED)
        note = "the IPvlan child is already gone" + (" with its netns" if not seen.netns_exists else "")
        return ReturnPlan(target, rdma, (), ReturnState.ALREADY_ON_HOST, note)
    if seen.in_pod is not None:
        cur = seen.in_pod
        steps: list[Step] = [
            MoveLink(Ns.POD, Ns.HOST, LinkLocator((cur.name,)), target.host_ifname),
            SetLinkState(Ns.HOST, target.host_ifname, up=True),
        ]
        if tag in cur.altnames:
            steps.append(DelAltname(Ns.HOST, target.host_ifname, tag))
        return ReturnPlan(target, rdma, tuple(steps), ReturnState.RETURNED)
    if seen.on_host is not None:
        cur = seen.on_host
        if cur.name == target.host_ifname and tag not in cur.altnames:
            return ReturnPlan(target, rdma, (), ReturnState.ALREADY_ON_HOST, "already on the host")
        # Back without us (its netns died, or an earlier return stopped half-way).
        steps = []
        if cur.name != target.host_ifname:
            steps.append(RenameLink(Ns.HOST, cur.name, target.host_ifname))
        steps.append(SetLinkState(Ns.HOST, target.host_ifname, up=True))
        if tag in cur.altnames:
            steps.append(DelAltname(Ns.HOST, target.host_ifname, tag))
        return ReturnPlan(target, rdma, tuple(steps), ReturnState.RECLAIMED, "found on the host")
    if not seen.netns_exists:
        return ReturnPlan(target, rdma, (), ReturnState.GONE, _GONE_NOTE)
    return ReturnPlan(
        target,
        rdma,
        (),
        ReturnState.GONE,
        f"{target.host_ifname} is neither in the pod netns ({target.locator().describe()}) nor on the host",
    )


# --- CreateContainer: RDMA device files ------------------------------------------------


def container_devices(configs: Iterable[store_pb2.DeviceConfig]) -> tuple[DeviceNode, ...]:
    """The RDMA device files every container of the pod gets (rdma_cm, uverbsN, and
    umadN, issmN, ucmN when present), each path once, in the order first seen."""
    seen: dict[str, DeviceNode] = {}
    for cfg in configs:
        for dev in cfg.rdma.dev_chars:
            if dev.path and dev.path not in seen:
                seen[dev.path] = _node(dev)
    return tuple(seen.values())
