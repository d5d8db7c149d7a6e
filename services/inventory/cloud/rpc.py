"""dranet.inventory.v1 ResolveProfile and ReleaseProfile on top of ``Providers``,
for the inventory's gRPC servicer:

    async def ResolveProfile(self, request, context):
        return await cloud_rpc.resolve(self.providers, self.lookup_device, request, context)

The response's config_json is the profile's part only; prepare merges it onto
its config (shared.netconfig.merge.merge(config, profile)). Errors abort the
call with a status that says whether retrying can help (UNAVAILABLE) or not.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import NoReturn

import grpc

from proto.dranet.inventory.v1 import inventory_pb2 as pb
from services.inventory.cloud.base import DeviceInfo, ProfileError, ProfileErrorCode, Providers
from shared.logs import log_fields
from shared.netconfig import ConfigError, NetworkConfig, parse_network_config

log = logging.getLogger(__name__)

# The device the inventory knows under a ResourceSlice name, or None.
DeviceLookup = Callable[[str], Awaitable[DeviceInfo | None]]

GRPC_CODES = {
    ProfileErrorCode.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ProfileErrorCode.INVALID: grpc.StatusCode.INVALID_ARGUMENT,
    ProfileErrorCode.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ProfileErrorCode.CONFLICT: grpc.StatusCode.ALREADY_EXISTS,
    ProfileErrorCode.FAILED_PRECONDITION: grpc.StatusCode.FAILED_PRECONDITION,
}


def request_config(profile: str, config_json: str, where: str) -> NetworkConfig:
    """The config a request carries, with its profile; ProfileError(INVALID) names the field."""
    try:
        cfg = parse_network_config(config_json) or NetworkConfig()
    except ConfigError as exc:
        raise ProfileError(f"{where}: config_json: {exc}", ProfileErrorCode.INVALID) from None
    if cfg.profile and profile and cfg.profile != profile:
        raise ProfileError(
            f"{where}: profile {profile!r} does not match config_json's profile {cfg.profile!r}",
            ProfileErrorCode.INVALID,
        )
    return replace(cfg, profile=cfg.profile or profile)


async def resolve_profile(
    providers: Providers, lookup: DeviceLookup, request: pb.ResolveProfileRequest
) -> str:
    """The profile's config JSON; raises ProfileError."""
    where = f"claim {request.claim_uid} device {request.device}"
    config = request_config(request.profile, request.config_json, where)
    if not config.profile:
        raise ProfileError(f"{where}: no profile named", ProfileErrorCode.INVALID)
    if providers.profiles is None:
        raise ProfileError(
            f"{where}: profile {config.profile!r} asked for, but this node has no profile provider"
            " (--profile-provider is none, or the cloud provider offers no profiles)",
            ProfileErrorCode.FAILED_PRECONDITION,
        )
    device = await lookup(request.device)
    if device is None:
        raise ProfileError(f"{where}: device not found in the inventory", ProfileErrorCode.NOT_FOUND)
    out = await providers.profiles.resolve_profile(device, request.claim_uid, config)
    log.info(
        "profile resolved",
        extra={
            **log_fields(claim=request.claim_uid, device=request.device, pod=request.pod_uid),
            "profile": config.profile,
            "provider": providers.profiles.name,
        },
    )
    return out.to_json()


async def release_profile(
    providers: Providers, lookup: DeviceLookup, request: pb.ReleaseProfileRequest
) -> None:
    """Idempotent; nothing to do without a profile provider. Raises ProfileError."""
    if providers.profiles is None:
        return
    where = f"claim {request.claim_uid} device {request.device}"
    config = request_config(request.profile, request.config_json, where)
    # The device may have left the node already; its name still identifies the lease.
    device = await lookup(request.device) or DeviceInfo(name=request.device)
    await providers.profiles.release_profile(device, request.claim_uid, config)
    log.info(
        "profile released",
        extra={**log_fields(claim=request.claim_uid, device=request.device), "profile": config.profile},
    )


async def _abort(context: grpc.aio.ServicerContext, exc: ProfileError) -> NoReturn:
    log.warning("profile call failed: %s", exc, extra={"code": exc.code.value})
    await context.abort(GRPC_CODES[exc.code], str(exc))
    raise AssertionError("unreachable: context.abort raises")


async def resolve(
    providers: Providers,
    lookup: DeviceLookup,
    request: pb.ResolveProfileRequest,
    context: grpc.aio.ServicerContext,
) -> pb.ResolveProfileResponse:
    """The ResolveProfile servicer method."""
    try:
        return pb.ResolveProfileResponse(config_json=await resolve_profile(providers, lookup, request))
    except ProfileError as exc:
        await _abort(context, exc)


async def release(
    providers: Providers,
    lookup: DeviceLookup,
    request: pb.ReleaseProfileRequest,
    context: grpc.aio.ServicerContext,
) -> pb.ReleaseProfileResponse:
    """The ReleaseProfile servicer method."""
    try:
        await release_profile(providers, lookup, request)
    except ProfileError as exc:
        await _abort(context, exc)
    return pb.ReleaseProfileResponse()
