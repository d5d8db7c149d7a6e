"""Detection and wiring: each cloud's local metadata server is recognised as that
cloud and no other; slow, hanging and absent servers never hold start-up past the
deadlines; the profile provider is picked as dranet picks it."""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import pytest

from services.inventory.cloud import coreweave, discovery
from services.inventory.cloud.base import DeviceInfo, Hint, ProfileSource, ProviderError
from services.inventory.cloud.discovery import CloudOptions, add_flags, detect, setup_providers
from services.inventory.cloud.gce import GceProvider
from services.inventory.cloud.host import HostProbe
from services.inventory.cloud.webhook import WebhookProvider
from shared import kubeapi
from shared.netconfig import NetworkConfig
from tests.integration.inventory.cloud.fakes import (
    CKS_LABELS,
    AlibabaMetadata,
    AwsImds,
    AzureImds,
    FakeServer,
    GceMetadata,
    KubeApi,
    OciImds,
    Webhook,
)
from tests.integration.inventory.cloud.support import eventually

NIC0 = DeviceInfo(name="eth0", ifname="eth0", mac="42:01:0a:80:00:46")


def everywhere(url: str, **extra: object) -> CloudOptions:
    """Options with every metadata endpoint pointed at ``url``."""
    opts = CloudOptions(
        gce_url=url,
        aws_url=url,
        azure_url=url,
        oke_url=url,
        alibaba_url=url,
        detect_timeout=3.0,
        startup_timeout=3.0,
    )
    return replace(opts, **extra)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("server", "hint"),
    [
        (GceMetadata(), Hint.GCE),
        (AwsImds(), Hint.AWS),
        (AzureImds(), Hint.AZURE),
        (OciImds(), Hint.OKE),
        (AlibabaMetadata(), Hint.ALIBABA),
        (Webhook(), Hint.NONE),  # a webhook is only detected when --webhook-url names it
    ],
    ids=lambda v: v.value if isinstance(v, Hint) else type(v).__name__,
)
async def test_each_cloud_is_recognised_and_only_it(serve, server: FakeServer, hint: Hint) -> None:
    await serve(server)
    t0 = time.monotonic()
    assert await detect(everywhere(server.url)) is hint
    # A 404 or a missing header is a clear "no": nothing waits for the deadline.
    assert time.monotonic() - t0 < 2.5


async def test_webhook_and_cks_detection(serve, closed_url: str) -> None:
    # The cloud probes keep retrying the refused endpoints until the deadline (the
    # metadata server may come up late at boot), so the webhook answer waits for it.
    hook = await serve(Webhook())
    assert await detect(everywhere(closed_url, webhook_url=hook.url, detect_timeout=1.0)) is Hint.WEBHOOK
    api = await serve(KubeApi(nodes={"g1234": dict(CKS_LABELS)}))
    client = kubeapi.KubeApi(kubeapi.KubeConfig(server=api.url))
    try:
        labels = coreweave.kube_node_labels(client, "g1234")
        # CKS ranks before the webhook, as in dranet.
        opts = everywhere(closed_url, webhook_url=hook.url, detect_timeout=1.0)
        assert await detect(opts, node_labels=labels) is Hint.CKS
    finally:
        await client.close()


async def test_priority_order_when_two_answer(serve) -> None:
    """GCE before AWS: with both answering, GCE wins even if AWS answers first."""
    gce_server = await serve(GceMetadata(delay=0.5))
    aws_server = await serve(AwsImds())
    opts = everywhere("http://127.0.0.1:9", gce_url=gce_server.url, aws_url=aws_server.url)
    assert await detect(opts) is Hint.GCE


async def test_hanging_metadata_does_not_block_detection(serve) -> None:
    server = await serve(GceMetadata(delay=60.0))
    t0 = time.monotonic()
    assert await detect(everywhere(server.url, detect_timeout=1.0)) is Hint.NONE
    assert time.monotonic() - t0 < 2.5


async def test_absent_metadata_is_bounded_by_the_deadline(closed_url: str) -> None:
    t0 = time.monotonic()
    assert await detect(everywhere(closed_url, detect_timeout=2.0)) is Hint.NONE
    assert time.monotonic() - t0 < 3.5


@pytest.mark.parametrize(
    ("server", "hint", "device", "attribute"),
    [
        (GceMetadata(delay=60.0), Hint.GCE, NIC0, "gce.dra.net/networkName"),
        (AwsImds(delay=60.0, instance_type="trn1.32xlarge"), Hint.AWS, None, None),
        (AzureImds(delay=60.0), Hint.AZURE, NIC0, "azure.dra.net/vmSize"),
        (OciImds(delay=60.0), Hint.OKE, NIC0, "oke.dra.net/shape"),
        (AlibabaMetadata(delay=60.0), Hint.ALIBABA, NIC0, "alibaba.dra.net/instanceType"),
    ],
    ids=["gce", "aws", "azure", "oke", "alibaba"],
)
async def test_slow_metadata_loads_in_the_background(
    serve, tmp_path, server: FakeServer, hint: Hint, device: DeviceInfo | None, attribute: str | None
) -> None:
    """A hinted cloud whose metadata server hangs: start-up returns after the start-up
    deadline, and the metadata (with a change notification) arrives once it answers."""
    await serve(server)
    opts = everywhere(
        server.url,
        hint=hint,
        startup_timeout=1.0,
        request_timeout=0.5,
        request_deadline=1.0,
        oca_config_dir=str(tmp_path),
    )
    t0 = time.monotonic()
    providers = await setup_providers(opts, host=HostProbe(sysfs_root=str(tmp_path)))
    try:
        assert time.monotonic() - t0 < 3.0
        cloud = providers.cloud
        assert cloud is not None and cloud.hint is hint and not cloud.ready
        if device is not None:
            assert await providers.device_attributes(device) == {}
        changes: list[int] = []
        cloud.add_listener(lambda: changes.append(1))
        server.delay = 0.0
        await eventually(lambda: bool(changes), 15.0, f"{hint} metadata loaded in the background")
        assert cloud.ready
        if device is not None and attribute is not None:
            assert attribute in await providers.device_attributes(device)
    finally:
        await providers.close()


async def test_hanging_webhook_fails_start_up_in_time(serve) -> None:
    hook = await serve(Webhook(delay=60.0))
    opts = everywhere("http://127.0.0.1:9", hint=Hint.NONE, profile_provider=ProfileSource.WEBHOOK,
                      webhook_url=hook.url, startup_timeout=1.0, webhook_timeout=0.5)  # fmt: skip
    t0 = time.monotonic()
    with pytest.raises(ProviderError, match="timed out"):
        await setup_providers(opts)
    assert time.monotonic() - t0 < 3.0


async def test_profile_provider_choices(serve, closed_url: str) -> None:
    gce_server = await serve(GceMetadata())
    # cloud: GCE resolves its own profiles.
    providers = await setup_providers(everywhere(gce_server.url, hint=Hint.GCE))
    try:
        assert providers.profiles is providers.cloud
        assert await providers.provider_config(NIC0) == NetworkConfig(profile="gce-managed")
    finally:
        await providers.close()
    # none: the advertised profile is dropped.
    providers = await setup_providers(
        everywhere(gce_server.url, hint=Hint.GCE, profile_provider=ProfileSource.NONE)
    )
    try:
        assert providers.profiles is None and await providers.provider_config(NIC0) is None
    finally:
        await providers.close()
    # webhook for profiles on top of GCE attributes.
    hook = await serve(Webhook(cloud_provider=False))
    opts = everywhere(
        gce_server.url, hint=Hint.GCE, profile_provider=ProfileSource.WEBHOOK, webhook_url=hook.url
    )
    providers = await setup_providers(opts)
    try:
        assert isinstance(providers.cloud, GceProvider)
        assert isinstance(providers.profiles, WebhookProvider)
    finally:
        await providers.close()
    # A profiles-only webhook hinted as the cloud provider is no cloud provider.
    providers = await setup_providers(everywhere(closed_url, hint=Hint.WEBHOOK, webhook_url=hook.url))
    try:
        assert providers.cloud is None and providers.profiles is None and providers.cloud_name == "none"
    finally:
        await providers.close()


async def test_unusable_webhook_profile_provider_is_an_error(serve, closed_url: str) -> None:
    opts = everywhere(
        closed_url,
        hint=Hint.NONE,
        profile_provider=ProfileSource.WEBHOOK,
        webhook_url=closed_url,
        startup_timeout=1.0,
    )
    with pytest.raises(ProviderError) as err:
        await setup_providers(opts)
    assert closed_url in str(err.value)
    hook = await serve(Webhook(profile_provider=False))
    with pytest.raises(ProviderError) as err:
        await setup_providers(replace(opts, webhook_url=hook.url))
    assert "does not offer profiles" in str(err.value) and hook.url in str(err.value)
    with pytest.raises(ProviderError, match="--webhook-url is required"):
        await setup_providers(replace(opts, webhook_url=""))


async def test_none_hint_and_a_failing_hinted_cloud(closed_url: str) -> None:
    providers = await setup_providers(everywhere(closed_url, hint=Hint.NONE))
    assert providers.cloud is None and providers.profiles is None and providers.hint is Hint.NONE
    # CKS needs the API server; without it the node just has no cloud provider.
    providers = await setup_providers(everywhere(closed_url, hint=Hint.CKS))
    assert providers.cloud is None


def test_flags() -> None:
    parser = argparse.ArgumentParser()
    add_flags(
        parser, env={"GCE_METADATA_HOST": "10.9.9.9:8080", "AWS_EC2_METADATA_SERVICE_ENDPOINT": "http://imds"}
    )
    opts = CloudOptions.from_args(parser.parse_args([]))
    assert opts.hint is None and opts.profile_provider is ProfileSource.CLOUD
    assert opts.gce_url == "http://10.9.9.9:8080" and opts.aws_url == "http://imds"
    assert opts.azure_url == "http://169.254.169.254" and opts.alibaba_url == "http://100.100.100.200"
    opts = CloudOptions.from_args(
        parser.parse_args(
            ["--cloud-provider-hint=NONE", "--profile-provider=webhook", "--webhook-url=unix:///run/w.sock"]
        )
    )
    assert opts.hint is Hint.NONE and opts.profile_provider is ProfileSource.WEBHOOK
    with pytest.raises(ValueError, match="'AZ'"):
        CloudOptions.from_args(parser.parse_args(["--cloud-provider-hint=AZ"]))
    with pytest.raises(ValueError, match="--profile-provider 'both'"):
        CloudOptions.from_args(parser.parse_args(["--profile-provider=both"]))
    assert discovery.DETECTION_ORDER[0] is Hint.GCE
