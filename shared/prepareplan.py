"""Prepare's decisions for one allocated device, as a pure function of values: pick the
opaque config, merge it over the provider config and a profile's answer, validate it
against the device (VF and IPvlan MTU, RDMA mode, RDMA-only devices), add a DHCP lease
and the host snapshot, and build the DeviceConfig to store. No I/O: ``plan_device`` says
when the service must first resolve a profile or take a lease, and is called again with
the answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from proto.dranet.inventory.v1 import inventory_pb2 as inv
from proto.dranet.store.v1 import store_pb2 as st
from shared.netconfig import (
    ConfigError,
    FieldError,
    InterfaceConfig,
    InterfaceType,
    NeighborConfig,
    NetworkConfig,
    RouteConfig,
    RuleConfig,
    parse_network_config,
)
from shared.netconfig.merge import merge
from shared.netconfig.pick import pick_config
from shared.netconfig.snapshot import HostSnapshot, apply_host_snapshot
from shared.netconfig.validate import finalize, validate_rdma_only

RDMA_EXCLUSIVE = "exclusive"
RDMA_SHARED = "shared"


class PlanError(ValueError):
    """The device cannot be prepared; the message names the request, the device and the field."""


@dataclass(frozen=True)
class Allocated:
    """One allocation result of this driver (``status.allocation.devices.results[i]``)."""

    request: str
    device: str
    pool: str | None

    @classmethod
    def from_result(cls, result: Mapping[str, Any]) -> Allocated:
        return cls(
            request=result.get("request", ""), device=result.get("device", ""), pool=result.get("pool")
        )

    @property
    def where(self) -> str:
        """The prefix of every error about this device."""
        return f"request {self.request} device {self.device}"

    def check_pool(self, node_name: str) -> None:
        """Only devices of this node's pool are prepared here."""
        if self.pool != node_name:
            raise PlanError(
                f"{self.where}: allocated from pool {self.pool!r}, not from this node's pool {node_name!r}"
            )


@dataclass(frozen=True)
class DeviceInputs:
    """Everything the plan reads for one device."""

    claim: st.ClaimRef
    pod: st.PodRef
    allocated: Allocated
    # status.allocation.devices.config: the DeviceClass and claim opaque configs.
    entries: Sequence[Mapping[str, Any]]
    # The inventory's answer: device facts, its provider config and its host snapshot.
    dev: inv.Device
    node: inv.NodeInfo
    driver: str
    node_name: str

    @property
    def where(self) -> str:
        return self.allocated.where


@dataclass(frozen=True)
class Lease:
    """A DHCP lease on the device's host interface."""

    address: str
    routes: tuple[RouteConfig, ...] = ()


@dataclass(frozen=True)
class NeedsProfile:
    """The merged config names a profile: resolve ``config.profile`` for ``config``, merge
    the answer (``merge_profile_answer``) and plan again with it as ``profiled``."""

    config: NetworkConfig


@dataclass(frozen=True)
class NeedsLease:
    """``interface.dhcp`` is set: take a lease on ``ifname`` and plan again with it."""

    ifname: str


@dataclass(frozen=True)
class DevicePlan:
    """What the store keeps for the device, and (PersistentResourceSliceAttributes) the
    device as the inventory publishes it; ``kept`` is None when not asked for or when the
    inventory did not say how it publishes the device."""

    config: st.DeviceConfig
    kept: st.KeptDevice | None


def plan_device(
    inputs: DeviceInputs,
    *,
    profiled: NetworkConfig | None = None,
    lease: Lease | None = None,
    now_unix_nano: int = 0,
    keep: bool = False,
) -> NeedsProfile | NeedsLease | DevicePlan:
    """The device's plan, or what the service must fetch first; PlanError when it cannot be
    prepared. ``profiled`` is the config with the profile's answer merged (or a provisional
    record's config being resumed): the pick and the provider merge are then skipped."""
    merged = profiled if profiled is not None else requested_config(inputs)
    if profiled is None and merged.profile:
        if not inputs.node.has_profile_provider:
            raise PlanError(
                f"{inputs.where}: profile {merged.profile!r} requested, "
                f"but node {inputs.node_name} has no profile provider"
            )
        return NeedsProfile(merged)
    final = checked_config(merged, inputs)
    if final.interface.dhcp is True:
        if lease is None:
            return NeedsLease(inputs.dev.ifname)
        final = apply_lease(final, lease)
    cfg = device_config(inputs, final, now_unix_nano)
    return DevicePlan(cfg, kept_device(cfg, inputs.dev) if keep else None)


def requested_config(inputs: DeviceInputs) -> NetworkConfig:
    """The picked opaque config (DeviceClass entries before claim entries) over the provider config."""
    where, dev = inputs.where, inputs.dev
    picked = pick_config(inputs.entries, inputs.allocated.request, inputs.driver)
    try:
        picked.raise_for_errors(where)
    except ConfigError as exc:
        raise PlanError(str(exc)) from None
    user = picked.config
    if dev.rdma_only:
        _raise_field_errors(where, validate_rdma_only(user))
    try:
        provider = parse_network_config(dev.provider_config_json) if dev.provider_config_json else None
    except ConfigError as exc:
        raise PlanError(f"{where}: the provider config is invalid: {exc}") from None
    return merge(user, provider)


def merge_profile_answer(where: str, config: NetworkConfig, answer_json: str) -> NetworkConfig:
    """``config`` over the profile provider's answer: the answer only fills what is unset."""
    try:
        answer = parse_network_config(answer_json) if answer_json else None
    except ConfigError as exc:
        raise PlanError(f"{where}: profile {config.profile!r} returned an invalid config: {exc}") from None
    return merge(config, answer)


def provisional_record(inputs: DeviceInputs, config: NetworkConfig) -> st.DeviceConfig:
    """The record saved while a profile is held, so a crash before the final save cannot
    lead to a second allocation; a retry resumes from its config."""
    return st.DeviceConfig(
        pod=inputs.pod,
        device=inputs.dev.name,
        claim=inputs.claim,
        request=inputs.allocated.request,
        driver=inputs.driver,
        pool=inputs.node_name,
        host_ifname=inputs.dev.ifname,
        profile=config.profile,
        pod_config_json=config.to_json(),
        provisional=True,
    )


def checked_config(merged: NetworkConfig, inputs: DeviceInputs) -> NetworkConfig:
    """The merged config defaulted and validated again, then checked against what only the
    inventory knows."""
    try:
        final = finalize(merged)
    except ConfigError as exc:
        raise PlanError(f"{inputs.where}: {exc}") from None
    check_against_device(final, inputs.dev, inputs.node, inputs.where)
    return final


def check_against_device(cfg: NetworkConfig, dev: inv.Device, node: inv.NodeInfo, where: str) -> None:
    """MTU limits, IPvlan and RDMA constraints of the device and the node."""
    itf = cfg.interface
    snap = dev.snapshot
    if dev.rdma_only:
        _raise_field_errors(where, validate_rdma_only(replace(cfg, profile="")))
        return
    if not dev.ifname:
        raise PlanError(f"{where}: the device has no network interface")
    if itf.mtu is not None and dev.is_sriov_vf:
        pf_mtu = snap.pf_mtu or dev.pf_mtu
        pf = snap.pf_ifname or dev.pf_ifname
        if pf_mtu and itf.mtu > pf_mtu:
            raise PlanError(f"{where}: interface.mtu {itf.mtu} exceeds PF {pf} MTU {pf_mtu}")
    if itf.effective_type == InterfaceType.IPVLAN:
        if node.rdma_netns_mode == RDMA_EXCLUSIVE:
            raise PlanError(
                f"{where}: interface.type IPVLAN is not supported when the node's RDMA netns mode is exclusive"
            )
        parent_mtu = snap.mtu or dev.mtu
        if itf.mtu is not None and parent_mtu and itf.mtu > parent_mtu:
            raise PlanError(f"{where}: interface.mtu {itf.mtu} exceeds parent {dev.ifname} MTU {parent_mtu}")


def apply_lease(cfg: NetworkConfig, lease: Lease) -> NetworkConfig:
    """The lease's address as the Pod's only address, its routes after the configured ones
    (a configured route wins for the same destination and table). Before the host
    snapshot, so host routes keep a source only if it is the lease's."""
    keys = {(r.destination, r.table) for r in cfg.routes}
    routes = cfg.routes + tuple(r for r in lease.routes if (r.destination, r.table) not in keys)
    return replace(cfg, interface=replace(cfg.interface, addresses=(lease.address,)), routes=routes)


def device_config(inputs: DeviceInputs, final: NetworkConfig, now_unix_nano: int) -> st.DeviceConfig:
    """The host snapshot added, and the record the store keeps."""
    dev, snap = inputs.dev, inputs.dev.snapshot
    final = apply_host_snapshot(final, host_snapshot(snap))
    if dev.ifname and not final.interface.name:
        # Without a name in the config the interface keeps its host name.
        final = replace(final, interface=replace(final.interface, name=dev.ifname))
    host = NetworkConfig(
        interface=InterfaceConfig(
            name=dev.ifname,
            mtu=snap.mtu or None,
            hardware_addr=snap.hardware_addr or None,
            addresses=tuple(a.cidr for a in snap.addresses),
        ),
        routes=tuple(route(r) for r in snap.routes),
        rules=tuple(rule(r) for r in snap.rules),
    )
    return st.DeviceConfig(
        pod=inputs.pod,
        device=inputs.allocated.device,
        claim=inputs.claim,
        request=inputs.allocated.request,
        driver=inputs.driver,
        pool=inputs.node_name,
        host_ifname=dev.ifname,
        pod_config_json=final.to_json(),
        host_config_json=host.to_json(),
        rdma=st.RdmaConfig(
            link_dev=snap.rdma_device or dev.rdma_device,
            dev_chars=[
                st.LinuxDevice(
                    path=d.path,
                    type=d.type,
                    major=d.major,
                    minor=d.minor,
                    file_mode=d.file_mode,
                    uid=d.uid,
                    gid=d.gid,
                )
                for d in snap.rdma_dev_chars
            ],
        ),
        profile=final.profile,
        rdma_netns_mode=inputs.node.rdma_netns_mode or RDMA_SHARED,
        prepared_unix_nano=now_unix_nano,
    )


def kept_device(cfg: st.DeviceConfig, dev: inv.Device) -> st.KeptDevice | None:
    """The device as the inventory publishes it, kept in the ResourceSlice while it is in
    the Pod; None when the inventory did not say (an inventory older than prepare)."""
    if not dev.slice_entry_json:
        return None
    return st.KeptDevice(
        device=cfg.device,
        claim=cfg.claim,
        pod_uid=cfg.pod.uid,
        pool=cfg.pool,
        device_json=dev.slice_entry_json,
        kept_unix_nano=cfg.prepared_unix_nano,
    )


def route(r: inv.Route) -> RouteConfig:
    return RouteConfig(
        destination=r.destination, gateway=r.gateway, source=r.source, scope=r.scope, table=r.table
    )


def rule(r: inv.Rule) -> RuleConfig:
    return RuleConfig(priority=r.priority, source=r.source, destination=r.destination, table=r.table)


def host_snapshot(snap: inv.HostSnapshot) -> HostSnapshot:
    """The inventory's snapshot as the netconfig step reads it."""
    return HostSnapshot(
        addresses=tuple(a.cidr for a in snap.addresses),
        routes=tuple(route(r) for r in snap.routes),
        rules=tuple(rule(r) for r in snap.rules),
        neighbors=tuple(
            NeighborConfig(destination=n.destination, hardware_addr=n.hardware_addr) for n in snap.neighbors
        ),
    )


def _raise_field_errors(where: str, errors: list[FieldError]) -> None:
    if errors:
        raise PlanError(f"{where}: " + "; ".join(str(e) for e in errors))
