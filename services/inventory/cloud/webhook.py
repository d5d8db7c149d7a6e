"""The webhook provider ("bring your own DRANET provider"): dranet's HTTP contract.

  GET  <url>/health                -> {"cloudProvider": bool, "profileProvider": bool}
  POST <url>/GetDeviceAttributes   body DeviceIdentifiers -> {"<domain>/<name>": {"string"|"int"|"bool"|"version": v}}
  POST <url>/GetDeviceConfig       body DeviceIdentifiers -> NetworkConfig
  POST <url>/GetProfileConfig      body {"device": DeviceIdentifiers, "claim_uid": uid, "config": NetworkConfig}
                                   -> NetworkConfig (the profile's part only)
  POST <url>/ReleaseProfileConfig  same body -> 200 (also when nothing was allocated)

DeviceIdentifiers is {"mac_address": ..., "pci_address": ..., "name": ...} (mac and
pci omitted when empty). As in dranet, ``name`` is the interface name for
attributes and the device name for configs and profiles. Any non-200 answer is an
error; dranet documents 400 (invalid request), 404 (unknown profile), 409
(conflict) and 500 (temporary). The URL may be http://, https:// (verified
against --webhook-ca-file or the system roots) or unix:///path.sock.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from services.inventory.cloud.base import (
    CloudProvider,
    DeviceInfo,
    Hint,
    Listener,
    ProfileError,
    ProfileErrorCode,
    ProfileProvider,
    ProviderError,
)
from services.inventory.cloud.metadata import (
    DETECT_POLICY,
    HttpClient,
    MetadataError,
    Response,
    RetryPolicy,
    probe_get,
)
from shared.deviceattr import Attribute, attribute_problem
from shared.netconfig import ConfigError, NetworkConfig, parse_network_config

log = logging.getLogger(__name__)

PATH_HEALTH = "/health"
PATH_GET_DEVICE_ATTRIBUTES = "/GetDeviceAttributes"
PATH_GET_DEVICE_CONFIG = "/GetDeviceConfig"
PATH_GET_PROFILE_CONFIG = "/GetProfileConfig"
PATH_RELEASE_PROFILE_CONFIG = "/ReleaseProfileConfig"
DEFAULT_TIMEOUT = 10.0
# After a failed attribute/config call, scans skip the webhook this long, so a
# down webhook costs one timeout per cooldown instead of one per device.
SCAN_COOLDOWN = 30.0
_JSON = {"Content-Type": "application/json"}
_STATUS_CODES = {
    400: ProfileErrorCode.INVALID,
    404: ProfileErrorCode.NOT_FOUND,
    409: ProfileErrorCode.CONFLICT,
}


@dataclass(frozen=True)
class Capabilities:
    cloud_provider: bool
    profile_provider: bool


def parse_capabilities(raw: Any) -> Capabilities:
    if not isinstance(raw, dict):
        raise ValueError(
            f"expected an object like {{'cloudProvider': true, 'profileProvider': true}}, got {raw!r:.100}"
        )
    out = {}
    for key in ("cloudProvider", "profileProvider"):
        value = raw.get(key, False)
        if not isinstance(value, bool):
            raise ValueError(f"{key} must be a boolean, got {value!r}")
        out[key] = value
    return Capabilities(cloud_provider=out["cloudProvider"], profile_provider=out["profileProvider"])


def device_identifiers(device: DeviceInfo, *, for_attributes: bool) -> dict[str, str]:
    """dranet's DeviceIdentifiers JSON for ``device``."""
    out: dict[str, str] = {}
    if device.mac:
        out["mac_address"] = device.mac
    if device.pci_address:
        out["pci_address"] = device.pci_address
    out["name"] = device.ifname if for_attributes else device.name
    return out


def _snippet(resp: Response) -> str:
    return resp.text.strip().replace("\n", " ")[:300]


async def probe(url: str, *, ca_file: str = "", policy: RetryPolicy = DETECT_POLICY) -> bool:
    """dranet's OnWebhook: GET /health answers 200."""
    if not url:
        return False
    return await probe_get(HttpClient("webhook", url, policy=policy, ca_file=ca_file), PATH_HEALTH)


class WebhookProvider(CloudProvider, ProfileProvider):
    """Both a cloud provider (when /health says cloudProvider) and a profile provider
    (when it says profileProvider)."""

    hint = Hint.WEBHOOK

    def __init__(
        self, url: str, *, ca_file: str = "", timeout: float = DEFAULT_TIMEOUT, startup_timeout: float = 10.0
    ) -> None:
        if not url:
            raise ProviderError("webhook: --webhook-url is required for the webhook provider")
        if not url.startswith(("http://", "https://", "unix://")):
            raise ProviderError(f"webhook: URL {url!r} must start with http://, https:// or unix://")
        self.url = url
        self.timeout = timeout
        self.startup_timeout = startup_timeout
        # One attempt per call, as dranet: a profile call is not blindly repeated,
        # the kubelet's retry of NodePrepareResources is the retry.
        self.client = HttpClient(
            "webhook",
            url,
            policy=RetryPolicy(request_timeout=timeout, deadline=timeout, retries=False),
            ca_file=ca_file,
        )
        self.capabilities: Capabilities | None = None
        self._scan_paused_until = 0.0
        self._last_attributes: dict[str, Mapping[str, Attribute]] = {}
        self._last_config: dict[str, NetworkConfig | None] = {}

    @property
    def name(self) -> str:
        return f"webhook {self.url}"

    @property
    def ready(self) -> bool:
        return self.capabilities is not None

    def add_listener(self, listener: Listener) -> None:
        """Webhook answers are read per call; there is no loaded state to change."""

    async def start(self) -> None:
        """Read the capabilities from /health (retrying within the start-up deadline).
        ProviderError names the URL when the webhook is down or answers garbage."""
        if self.capabilities is not None:
            return
        policy = RetryPolicy(request_timeout=min(self.timeout, 5.0), deadline=self.startup_timeout)
        try:
            resp = await self.client.request("GET", PATH_HEALTH, policy=policy)
            try:
                self.capabilities = parse_capabilities(json.loads(resp.body))
            except ValueError as exc:
                raise ProviderError(
                    f"webhook {self.url}: {PATH_HEALTH} answered garbage ({exc}): {_snippet(resp)!r}"
                ) from None
        except MetadataError as exc:
            await self.client.close()
            raise ProviderError(f"webhook {self.url}: health check failed: {exc.reason}") from None
        except ProviderError:
            await self.client.close()
            raise
        log.info(
            "webhook capabilities",
            extra={
                "url": self.url,
                "cloud_provider": self.capabilities.cloud_provider,
                "profile_provider": self.capabilities.profile_provider,
            },
        )

    async def close(self) -> None:
        await self.client.close()

    def _scan_allowed(self) -> bool:
        return time.monotonic() >= self._scan_paused_until

    def _scan_failed(self, call: str, device: DeviceInfo, **details: Any) -> None:
        self._scan_paused_until = time.monotonic() + SCAN_COOLDOWN
        log.warning(
            "webhook %s failed; keeping the last answers and skipping webhook scan calls for %.0fs",
            call,
            SCAN_COOLDOWN,
            extra={"device": device.name, "url": self.url, **details},
        )

    async def _post(self, path: str, body: Mapping[str, Any]) -> Response:
        return await self.client.request(
            "POST",
            path,
            headers=_JSON,
            data=json.dumps(body).encode(),
            ok_statuses=frozenset(range(100, 600)),
        )

    async def _scan_call(self, call: str, path: str, device: DeviceInfo, *, for_attributes: bool) -> Any:
        """One attribute/config call of a scan: the decoded JSON answer, or None when it
        failed (logged; later scan calls skip the webhook for SCAN_COOLDOWN, so a down
        webhook costs one timeout per cooldown rather than one per device)."""
        if not self._scan_allowed():
            return None
        try:
            resp = await self._post(path, device_identifiers(device, for_attributes=for_attributes))
        except MetadataError as exc:
            self._scan_failed(call, device, error=str(exc))
            return None
        if resp.status != 200:
            self._scan_failed(call, device, status=resp.status, body=_snippet(resp))
            return None
        try:
            return json.loads(resp.body)
        except ValueError:
            self._scan_failed(call, device, error="answer is not JSON", body=_snippet(resp))
            return None

    async def device_attributes(self, device: DeviceInfo) -> Mapping[str, Attribute]:
        if self.capabilities is None or not self.capabilities.cloud_provider:
            return {}
        raw = await self._scan_call(
            "GetDeviceAttributes", PATH_GET_DEVICE_ATTRIBUTES, device, for_attributes=True
        )
        if raw is None:
            # A webhook hiccup must not strip attributes from the published slices.
            return self._last_attributes.get(device.name, {})
        if not isinstance(raw, dict):
            self._scan_failed(
                "GetDeviceAttributes", device, error=f"expected an object, got {type(raw).__name__}"
            )
            return self._last_attributes.get(device.name, {})
        attrs: dict[str, Attribute] = {}
        for key, value in raw.items():
            try:
                attr = Attribute.from_json(value)
            except ValueError as exc:
                log.warning(
                    "webhook attribute dropped",
                    extra={"device": device.name, "attribute": key, "error": str(exc)},
                )
                continue
            problem = attribute_problem(key, attr)
            if problem:
                log.warning("webhook attribute dropped", extra={"device": device.name, "error": problem})
                continue
            attrs[key] = attr
        self._last_attributes[device.name] = attrs
        return attrs

    async def provider_config(self, device: DeviceInfo) -> NetworkConfig | None:
        if self.capabilities is None or not self.capabilities.cloud_provider:
            return None
        raw = await self._scan_call("GetDeviceConfig", PATH_GET_DEVICE_CONFIG, device, for_attributes=False)
        if raw is None:
            return self._last_config.get(device.name)
        try:
            cfg = parse_network_config(raw)
        except ConfigError as exc:
            self._scan_failed("GetDeviceConfig", device, error=f"invalid config: {exc}")
            return self._last_config.get(device.name)
        result = None if cfg is None or cfg.is_empty() else cfg
        self._last_config[device.name] = result
        return result

    def _profile_request(self, device: DeviceInfo, claim_uid: str, config: NetworkConfig) -> dict[str, Any]:
        return {
            "device": device_identifiers(device, for_attributes=False),
            "claim_uid": claim_uid,
            "config": config.to_dict(),
        }

    def _check_profiles(self, where: str) -> None:
        if self.capabilities is None:
            raise ProfileError(f"{where}: webhook {self.url} has not answered {PATH_HEALTH} yet")
        if not self.capabilities.profile_provider:
            raise ProfileError(
                f"{where}: webhook {self.url} does not offer profiles (profileProvider is false)",
                ProfileErrorCode.FAILED_PRECONDITION,
            )

    async def _profile_call(self, where: str, path: str, body: Mapping[str, Any]) -> Response:
        try:
            resp = await self._post(path, body)
        except MetadataError as exc:
            raise ProfileError(f"{where}: webhook {self.url}{path}: {exc.reason}") from None
        if resp.status != 200:
            code = _STATUS_CODES.get(resp.status, ProfileErrorCode.UNAVAILABLE)
            detail = _snippet(resp)
            raise ProfileError(
                f"{where}: webhook {self.url}{path} answered HTTP {resp.status}"
                + (f": {detail}" if detail else ""),
                code,
            )
        return resp

    async def resolve_profile(
        self, device: DeviceInfo, claim_uid: str, config: NetworkConfig
    ) -> NetworkConfig:
        where = f"profile {config.profile!r} for device {device.name} claim {claim_uid}"
        self._check_profiles(where)
        resp = await self._profile_call(
            where, PATH_GET_PROFILE_CONFIG, self._profile_request(device, claim_uid, config)
        )
        try:
            cfg = parse_network_config(resp.body)
        except ConfigError as exc:
            raise ProfileError(
                f"{where}: webhook {self.url}{PATH_GET_PROFILE_CONFIG} answered an invalid config: {exc};"
                f" body {_snippet(resp)!r}"
            ) from None
        return cfg or NetworkConfig()

    async def release_profile(self, device: DeviceInfo, claim_uid: str, config: NetworkConfig) -> None:
        where = f"release of profile {config.profile!r} for device {device.name} claim {claim_uid}"
        self._check_profiles(where)
        await self._profile_call(
            where, PATH_RELEASE_PROFILE_CONFIG, self._profile_request(device, claim_uid, config)
        )
