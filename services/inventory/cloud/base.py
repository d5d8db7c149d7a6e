"""The provider interface the inventory wires: cloud providers (attributes and a
per-device provider config from instance metadata) and profile providers
(claim-scoped configs that prepare asks for through dranet.inventory.v1).

dranet keeps the same split (pkg/cloudprovider/cloud.go): a CloudInstance adds
attributes and a provider config per device, an optional ProfileProvider
resolves and releases profiles. A cloud provider "advertises" a profile by
naming it in its provider config; without a profile provider the inventory drops
that name (``strip_advertised_profile``).

Everything here is async and never blocks the loop. Metadata is loaded once at
start-up within a deadline and then in the background (``CloudProvider.start``),
so a slow or absent metadata server never holds the inventory back for long.
"""

from __future__ import annotations

import abc
import asyncio
import enum
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import ClassVar

from shared.deviceattr import Attribute, attribute_problem
from shared.netconfig import NetworkConfig

log = logging.getLogger(__name__)


class Hint(enum.StrEnum):
    """The --cloud-provider-hint values, spelled as dranet spells them."""

    GCE = "GCE"
    AWS = "AWS"
    AZURE = "AZURE"
    OKE = "OKE"
    ALIBABA = "ALIBABA"
    CKS = "CKS"  # CoreWeave Kubernetes Service
    WEBHOOK = "webhook"
    NONE = "NONE"

    @classmethod
    def parse(cls, value: str) -> Hint | None:
        """The hint for a flag value; None for "" (auto-detect). ValueError names the value."""
        if value == "":
            return None
        if value in ("none", "NONE"):
            return cls.NONE
        for hint in cls:
            if value == hint.value:
                return hint
        allowed = ", ".join(h.value for h in cls)
        raise ValueError(f"unknown cloud provider hint {value!r} (supported: {allowed}, or empty to detect)")


class ProfileSource(enum.StrEnum):
    """The --profile-provider values: the cloud provider's own, the webhook, or none."""

    CLOUD = "cloud"
    WEBHOOK = "webhook"
    NONE = "none"


def string_attributes(pairs: Iterable[tuple[str, str]]) -> dict[str, Attribute]:
    """String attributes for the (name, value) pairs whose value is known: metadata
    that leaves a field empty publishes no attribute for it."""
    return {name: Attribute.of_string(value) for name, value in pairs if value}


@dataclass(frozen=True)
class DeviceInfo:
    """What the inventory knows about one device; providers match metadata on it.

    dranet matches by MAC (GCE, Azure) or PCI address (AWS, Alibaba, OKE, CKS).
    ``mac`` is lower-case colon form; ``pci_address`` is the full domain form
    (0000:00:04.0); ``ifname`` is "" for an RDMA-only device.
    """

    name: str
    ifname: str = ""
    mac: str = ""
    pci_address: str = ""
    rdma: bool = False
    rdma_device: str = ""


class ProviderError(Exception):
    """A provider could not be set up or could not answer; the message names the
    provider and the endpoint."""


class ProfileErrorCode(enum.StrEnum):
    """How prepare should treat a failed resolution. All of them fail the claim;
    UNAVAILABLE ones are expected to pass when the kubelet retries."""

    UNAVAILABLE = "unavailable"  # provider down, timeout, 5xx, metadata not loaded yet
    INVALID = "invalid"  # the config asks for something the profile cannot give (HTTP 400)
    NOT_FOUND = "not_found"  # unknown profile (HTTP 404)
    CONFLICT = "conflict"  # e.g. a requested address is taken (HTTP 409)
    FAILED_PRECONDITION = "failed_precondition"  # no profile provider on this node


class ProfileError(Exception):
    """A profile could not be resolved or released; the message names the device,
    the claim, the profile and the provider (or webhook URL)."""

    def __init__(self, message: str, code: ProfileErrorCode = ProfileErrorCode.UNAVAILABLE) -> None:
        super().__init__(message)
        self.code = code


Listener = Callable[[], None]


class CloudProvider(abc.ABC):
    """One cloud's metadata for this node.

    Lifecycle: construct, ``await start()`` (returns within the provider's start-up
    deadline even when the metadata server is slow or down, and keeps loading in
    the background), use, ``await close()``. ``add_listener`` callbacks run (on the
    loop) whenever the loaded metadata changes, so the inventory can rescan.
    """

    hint: ClassVar[Hint]

    @property
    def name(self) -> str:
        """Lower-case provider name for NodeInfo.cloud_provider and logs ("gce")."""
        return self.hint.value.lower()

    @abc.abstractmethod
    async def start(self) -> None:
        """Load metadata within the start-up deadline; continue in the background."""

    @property
    @abc.abstractmethod
    def ready(self) -> bool:
        """True once metadata has been loaded at least once."""

    @abc.abstractmethod
    def add_listener(self, listener: Listener) -> None:
        """Call ``listener()`` when the loaded metadata changes."""

    @abc.abstractmethod
    async def device_attributes(self, device: DeviceInfo) -> Mapping[str, Attribute]:
        """Attributes to add to ``device``, keyed by qualified name ("gce.dra.net/networkName").
        Empty when nothing is known about the device (or metadata is not loaded yet)."""

    @abc.abstractmethod
    async def provider_config(self, device: DeviceInfo) -> NetworkConfig | None:
        """The provider config of ``device`` (step 2 of the config pipeline: the user's
        config is merged onto it), or None. A non-empty ``profile`` in it is the
        profile this provider advertises for the device."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop background work and close HTTP sessions. Idempotent."""


class ProfileProvider(abc.ABC):
    """Resolves claim-scoped profiles (dranet's ProfileProvider)."""

    @property
    @abc.abstractmethod
    def name(self) -> str:
        """Provider name for logs and errors ("gce", "webhook http://...")."""

    @abc.abstractmethod
    async def resolve_profile(
        self, device: DeviceInfo, claim_uid: str, config: NetworkConfig
    ) -> NetworkConfig:
        """Step 3 of the pipeline: the profile's output for ``config.profile``.

        ``config`` is the whole merged config so far (user over provider config).
        The result is *only* what the profile contributes; prepare merges it with
        ``shared.netconfig.merge.merge(config, result)`` so it fills unset fields
        and adds list entries. Calling it again for the same device and claim
        returns an equivalent result without allocating anything new.
        Raises ProfileError.
        """

    @abc.abstractmethod
    async def release_profile(self, device: DeviceInfo, claim_uid: str, config: NetworkConfig) -> None:
        """Free what ``resolve_profile`` allocated for (device, claim). Idempotent:
        releasing what is not allocated succeeds. Raises ProfileError."""

    async def close(self) -> None:  # noqa: B027 - most profile providers hold nothing to close
        """Close HTTP sessions. Idempotent."""


def advertised_profiles(config: NetworkConfig | None) -> tuple[str, ...]:
    """The profiles a provider config advertises (dranet: its ``profile`` field)."""
    if config is None or not config.profile:
        return ()
    return (config.profile,)


def strip_advertised_profile(
    config: NetworkConfig | None, has_profile_provider: bool
) -> NetworkConfig | None:
    """Seed rule: without a profile provider the inventory drops the profile a cloud
    provider advertised, so prepare never asks for a profile nobody resolves."""
    if config is None or has_profile_provider or not config.profile:
        return config
    stripped = replace(config, profile="")
    return None if stripped.is_empty() else stripped


@dataclass(frozen=True)
class CloudView:
    """What the cloud side adds to one device: attributes to publish, its provider
    config (profile already dropped without a profile provider), and the profiles
    it advertises (Device.profiles in dranet.inventory.v1)."""

    attributes: Mapping[str, Attribute]
    config: NetworkConfig | None

    @property
    def profiles(self) -> tuple[str, ...]:
        return advertised_profiles(self.config)


@dataclass
class Providers:
    """What ``setup_providers`` wired for this node."""

    hint: Hint
    cloud: CloudProvider | None
    profiles: ProfileProvider | None

    @property
    def cloud_name(self) -> str:
        """NodeInfo.cloud_provider: "gce", "aws", ... or "none"."""
        return self.cloud.name if self.cloud is not None else "none"

    async def device_attributes(self, device: DeviceInfo) -> dict[str, Attribute]:
        """The cloud provider's attributes for ``device`` that the API server accepts;
        others are logged and dropped. Never raises: a failing provider adds nothing."""
        if self.cloud is None:
            return {}
        try:
            attrs = await self.cloud.device_attributes(device)
        except Exception as exc:  # a provider bug must not stop the scan
            log.warning(
                "cloud provider attributes failed: %s",
                exc,
                extra={"device": device.name, "provider": self.cloud.name},
            )
            return {}
        out: dict[str, Attribute] = {}
        for key, attr in attrs.items():
            problem = attribute_problem(key, attr)
            if problem:
                log.warning(
                    "dropping cloud attribute: %s",
                    problem,
                    extra={"device": device.name, "provider": self.cloud.name},
                )
                continue
            out[key] = attr
        return out

    async def provider_config(self, device: DeviceInfo) -> NetworkConfig | None:
        """The provider config of ``device`` with the advertised profile dropped when
        there is no profile provider. Never raises."""
        if self.cloud is None:
            return None
        try:
            cfg = await self.cloud.provider_config(device)
        except Exception as exc:
            log.warning(
                "cloud provider config failed: %s",
                exc,
                extra={"device": device.name, "provider": self.cloud.name},
            )
            return None
        return strip_advertised_profile(cfg, self.profiles is not None)

    async def describe(self, devices: Sequence[DeviceInfo], concurrency: int = 16) -> dict[str, CloudView]:
        """``device_attributes`` and ``provider_config`` for many devices at once (a scan),
        with at most ``concurrency`` provider calls in flight. Never raises."""
        sem = asyncio.Semaphore(concurrency)

        async def one(device: DeviceInfo) -> tuple[str, CloudView]:
            async with sem:
                attrs = await self.device_attributes(device)
                config = await self.provider_config(device)
            return device.name, CloudView(attributes=attrs, config=config)

        if self.cloud is None:
            return {d.name: CloudView(attributes={}, config=None) for d in devices}
        return dict(await asyncio.gather(*(one(d) for d in devices)))

    async def close(self) -> None:
        if self.profiles is not None and self.profiles is not self.cloud:
            await self.profiles.close()
        if self.cloud is not None:
            await self.cloud.close()
