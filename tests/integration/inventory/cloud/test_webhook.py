"""Webhook provider against a local webhook speaking dranet's contract: a
whereabouts-like IPAM keyed by claim UID, over http, https (self-signed CA) and
a Unix socket, plus a webhook that is down, slow, failing or talking nonsense."""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import time
from pathlib import Path

import pytest

from services.inventory.cloud import webhook
from services.inventory.cloud.base import DeviceInfo, ProfileError, ProfileErrorCode, ProviderError, Providers
from shared.deviceattr import Attribute
from shared.netconfig import NetworkConfig, RouteConfig
from shared.netconfig.merge import merge
from tests.integration.inventory.cloud.fakes import Webhook

DUMMY1 = DeviceInfo(name="dummy1", ifname="dummy1", mac="ce:11:22:33:44:55")
NIC = DeviceInfo(name="pci-0000-00-05-0", ifname="ens5", mac="02:00:00:00:00:05", pci_address="0000:00:05.0")
PROFILE = NetworkConfig(profile="python-profile")


async def started(url: str, **kwargs: object) -> webhook.WebhookProvider:
    kwargs.setdefault("startup_timeout", 1.0)
    provider = webhook.WebhookProvider(url, **kwargs)  # type: ignore[arg-type]
    await provider.start()
    return provider


async def test_capabilities_attributes_and_config(serve) -> None:
    server = await serve(Webhook())
    provider = await started(server.url)
    try:
        assert provider.capabilities == webhook.Capabilities(cloud_provider=True, profile_provider=True)
        attrs = await provider.device_attributes(DUMMY1)
        # Invalid names and over-long values are dropped; the rest keep their types.
        assert attrs == {
            "dra.net/webhook_attr": Attribute.of_string("python"),
            "example.com/rail": Attribute.of_int(3),
            "example.com/fast": Attribute.of_bool(True),
            "example.com/fw": Attribute.of_version("1.2.3"),
        }
        assert await provider.device_attributes(NIC) == {}
        cfg = await provider.provider_config(DUMMY1)
        assert cfg is not None and cfg.interface.mtu == 1450
        assert await provider.provider_config(NIC) is None
    finally:
        await provider.close()
    bodies = {r.path: json.loads(r.body) for r in server.requests if r.method == "POST"}
    # dranet's DeviceIdentifiers: the interface name for attributes, the device name for configs.
    assert bodies["/GetDeviceAttributes"] == {
        "mac_address": "02:00:00:00:00:05",
        "pci_address": "0000:00:05.0",
        "name": "ens5",
    }
    assert bodies["/GetDeviceConfig"]["name"] == "pci-0000-00-05-0"
    post = next(r for r in server.requests if r.method == "POST")
    assert post.headers["Content-Type"] == "application/json"


async def test_resolve_release_round_trip(serve) -> None:
    server = await serve(Webhook())
    provider = await started(server.url)
    try:
        user = NetworkConfig(
            profile="python-profile", routes=(RouteConfig(destination="10.9.0.0/16", gateway="10.200.200.1"),)
        )
        out = await provider.resolve_profile(NIC, "uid-1", user)
        assert out.interface.addresses == ("10.200.200.1/24",)
        assert out.routes == (RouteConfig(destination="10.201.0.0/16", gateway="10.200.200.1"),)
        # Idempotent per claim, as the contract asks of the webhook.
        assert await provider.resolve_profile(NIC, "uid-1", user) == out
        other = await provider.resolve_profile(NIC, "uid-2", user)
        assert other.interface.addresses == ("10.200.200.2/24",)
        merged = merge(user, out)
        assert merged.interface.addresses == ("10.200.200.1/24",) and len(merged.routes) == 2

        req = json.loads(next(r for r in server.requests if r.path == "/GetProfileConfig").body)
        assert req == {
            "device": {
                "mac_address": "02:00:00:00:00:05",
                "pci_address": "0000:00:05.0",
                "name": "pci-0000-00-05-0",
            },
            "claim_uid": "uid-1",
            "config": user.to_dict(),
        }
        await provider.release_profile(NIC, "uid-1", merged)
        assert "uid-1" not in server.leases
        await provider.release_profile(NIC, "uid-1", merged)  # released twice: still fine
        with pytest.raises(ProfileError) as err:
            await provider.resolve_profile(NIC, "uid-3", NetworkConfig(profile="unknown"))
        assert err.value.code is ProfileErrorCode.NOT_FOUND
        assert f"{server.url}/GetProfileConfig answered HTTP 404" in str(err.value) and "uid-3" in str(
            err.value
        )
    finally:
        await provider.close()


@pytest.mark.parametrize(
    ("forced", "code", "needle"),
    [
        (
            (500, "IPAM plugin failed: pool exhausted"),
            ProfileErrorCode.UNAVAILABLE,
            "HTTP 500: IPAM plugin failed",
        ),
        ((400, "address outside the subnet"), ProfileErrorCode.INVALID, "HTTP 400"),
        ((409, "address in use"), ProfileErrorCode.CONFLICT, "HTTP 409"),
        ((200, "<html>oops</html>"), ProfileErrorCode.UNAVAILABLE, "answered an invalid config"),
        ((200, '{"interface": {"mtu": "big"}}'), ProfileErrorCode.UNAVAILABLE, "interface.mtu"),
        ((200, '{"surprise": 1}'), ProfileErrorCode.UNAVAILABLE, "surprise"),
    ],
)
async def test_failures_name_the_webhook(
    serve, forced: tuple[int, str], code: ProfileErrorCode, needle: str
) -> None:
    server = await serve(Webhook(forced=forced))
    provider = await started(server.url)
    try:
        with pytest.raises(ProfileError) as err:
            await provider.resolve_profile(NIC, "uid-9", PROFILE)
        assert err.value.code is code
        assert server.url in str(err.value) and needle in str(err.value) and "uid-9" in str(err.value)
    finally:
        await provider.close()


async def test_timeout_is_bounded_and_named(serve) -> None:
    server = await serve(Webhook())
    provider = await started(server.url, timeout=0.5)
    server.delay = 5.0
    try:
        t0 = time.monotonic()
        with pytest.raises(ProfileError) as err:
            await provider.resolve_profile(NIC, "uid-t", PROFILE)
        elapsed = time.monotonic() - t0
        assert elapsed < 3.0, elapsed
        assert "timed out" in str(err.value) and server.url in str(err.value)
        assert err.value.code is ProfileErrorCode.UNAVAILABLE
    finally:
        await provider.close()


async def test_down_webhook(serve, closed_url: str) -> None:
    with pytest.raises(ProviderError) as err:
        await started(closed_url)
    assert closed_url in str(err.value) and "health" in str(err.value)
    # A webhook that was up at start and went away later.
    server = await serve(Webhook())
    provider = await started(server.url)
    await server.stop()
    try:
        with pytest.raises(ProfileError) as perr:
            await provider.resolve_profile(NIC, "uid-d", PROFILE)
        assert server.url in str(perr.value) and "unreachable" in str(perr.value)
        with pytest.raises(ProfileError):
            await provider.release_profile(NIC, "uid-d", PROFILE)
        assert await provider.device_attributes(DUMMY1) == {}
    finally:
        await provider.close()


async def test_health_garbage_and_missing_capability(serve) -> None:
    server = await serve(Webhook(health_body="this is not json"))
    with pytest.raises(ProviderError) as err:
        await started(server.url)
    assert server.url in str(err.value) and "garbage" in str(err.value)
    server.health_body = '{"cloudProvider": "yes"}'
    with pytest.raises(ProviderError) as err:
        await started(server.url)
    assert "cloudProvider must be a boolean" in str(err.value)

    only_cloud = await serve(Webhook(profile_provider=False))
    provider = await started(only_cloud.url)
    try:
        with pytest.raises(ProfileError) as perr:
            await provider.resolve_profile(NIC, "u", PROFILE)
        assert perr.value.code is ProfileErrorCode.FAILED_PRECONDITION
        assert not [r for r in only_cloud.requests if r.path == "/GetProfileConfig"]
    finally:
        await provider.close()


async def test_unix_socket(serve, tmp_path: Path) -> None:
    sock = tmp_path / "webhook.sock"
    server = await serve(Webhook(), unix_path=str(sock))
    assert server.url == f"unix://{sock}"
    assert await webhook.probe(server.url)
    provider = await started(server.url)
    try:
        out = await provider.resolve_profile(NIC, "uid-u", PROFILE)
        assert out.interface.addresses == ("10.200.200.1/24",)
    finally:
        await provider.close()


def make_pki(directory: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1 signed by it (openssl CLI)."""
    openssl = shutil.which("openssl")
    assert openssl, "the openssl command is needed (Debian package openssl)"

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], check=True, capture_output=True, cwd=directory)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run(
        "req",
        "-x509",
        *ec,
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=dranet-test-ca",
    )
    run("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1")
    (directory / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    run(
        "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "server.pem", "-days", "2", "-extfile", "ext.cnf",
    )  # fmt: skip
    return directory / "ca.pem", directory / "server.pem", directory / "server.key"


async def test_https_with_a_private_ca(serve, tmp_path: Path) -> None:
    ca, cert, key = make_pki(tmp_path)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    server = await serve(Webhook(), ssl_context=tls)
    assert server.url.startswith("https://127.0.0.1:")

    provider = await started(server.url, ca_file=str(ca))
    try:
        out = await provider.resolve_profile(NIC, "uid-s", PROFILE)
        assert out.interface.addresses == ("10.200.200.1/24",)
        assert await webhook.probe(server.url, ca_file=str(ca))
    finally:
        await provider.close()

    # Without the CA the certificate is not trusted, and the error says so.
    with pytest.raises(ProviderError) as err:
        await started(server.url)
    assert server.url in str(err.value) and "certificate" in str(err.value)


async def test_a_failing_webhook_keeps_the_last_answers_during_a_scan(serve) -> None:
    """One failed scan call pauses scan calls for a cooldown; devices keep the
    attributes and config they had, so published slices do not churn."""
    server = await serve(Webhook())
    provider = await started(server.url, timeout=0.5)
    providers = Providers(hint=provider.hint, cloud=provider, profiles=provider)
    try:
        before = await providers.describe([DUMMY1, NIC])
        assert before["dummy1"].attributes["dra.net/webhook_attr"] == Attribute.of_string("python")
        assert before["dummy1"].config is not None and before["dummy1"].config.interface.mtu == 1450
        assert before["pci-0000-00-05-0"].profiles == ()
        server.delay = 5.0  # hangs past the call timeout
        calls = len(server.requests)
        t0 = time.monotonic()
        after = await providers.describe([DUMMY1, NIC, DeviceInfo(name="new0", ifname="new0")])
        assert time.monotonic() - t0 < 2.0
        assert after["dummy1"] == before["dummy1"]
        assert after["new0"].attributes == {} and after["new0"].config is None
        # The whole scan cost at most one hanging call per concurrent slot, not one per device.
        assert len(server.requests) - calls <= 3
    finally:
        await provider.close()
