"""Flags, cloud detection and provider wiring (dranet cmd/dranet/app.go
setupProviders and pkg/cloudprovider/discovery).

Detection probes GCE, AWS, Azure, OKE, Alibaba, CKS and the webhook in dranet's
priority order, but all at once and under one deadline, so a node outside any
cloud waits at most ``--cloud-detect-timeout`` rather than the sum of every
probe's retries.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

from services.inventory.cloud import alibaba, aws, azure, coreweave, gce, oke, webhook
from services.inventory.cloud.base import (
    CloudProvider,
    Hint,
    ProfileProvider,
    ProfileSource,
    ProviderError,
    Providers,
)
from services.inventory.cloud.host import HostProbe
from services.inventory.cloud.ipam import LeaseStore
from services.inventory.cloud.metadata import RetryPolicy, first_true

log = logging.getLogger(__name__)

DETECTION_ORDER = (Hint.GCE, Hint.AWS, Hint.AZURE, Hint.OKE, Hint.ALIBABA, Hint.CKS, Hint.WEBHOOK)
LEASE_FILE = "cloud-ipam-leases.json"


@dataclass(frozen=True)
class CloudOptions:
    """Everything the providers need from the command line."""

    hint: Hint | None = None  # None: detect
    profile_provider: ProfileSource = ProfileSource.CLOUD
    webhook_url: str = ""
    webhook_ca_file: str = ""
    webhook_timeout: float = webhook.DEFAULT_TIMEOUT
    detect_timeout: float = 5.0
    startup_timeout: float = 10.0
    request_timeout: float = 2.0
    request_deadline: float = 10.0
    gce_url: str = gce.DEFAULT_URL
    aws_url: str = aws.DEFAULT_URL
    azure_url: str = azure.DEFAULT_URL
    oke_url: str = oke.DEFAULT_URL
    alibaba_url: str = alibaba.DEFAULT_URL
    state_dir: str = ""
    oca_config_dir: str = oke.DEFAULT_OCA_CONFIG_DIR
    aws_efa_topology_file: str = ""

    @property
    def policy(self) -> RetryPolicy:
        return RetryPolicy(request_timeout=self.request_timeout, deadline=self.request_deadline)

    @property
    def detect_policy(self) -> RetryPolicy:
        # Each probe may use the whole detection budget; first_true enforces it overall.
        per_try = min(1.0, self.detect_timeout)
        return RetryPolicy(
            request_timeout=per_try, deadline=self.detect_timeout, initial_backoff=0.25, max_backoff=1.0
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> CloudOptions:
        """From a namespace filled by ``add_flags``; ValueError names a bad flag value."""
        try:
            profile = ProfileSource(args.profile_provider)
        except ValueError:
            allowed = ", ".join(p.value for p in ProfileSource)
            raise ValueError(
                f"--profile-provider {args.profile_provider!r} is not one of {allowed}"
            ) from None
        return cls(
            hint=Hint.parse(args.cloud_provider_hint),
            profile_provider=profile,
            webhook_url=args.webhook_url,
            webhook_ca_file=args.webhook_ca_file,
            webhook_timeout=args.webhook_timeout,
            detect_timeout=args.cloud_detect_timeout,
            startup_timeout=args.cloud_startup_timeout,
            request_timeout=args.cloud_request_timeout,
            request_deadline=args.cloud_request_deadline,
            gce_url=args.gce_metadata_url,
            aws_url=args.aws_metadata_url,
            azure_url=args.azure_metadata_url,
            oke_url=args.oke_metadata_url,
            alibaba_url=args.alibaba_metadata_url,
            state_dir=args.cloud_state_dir,
            oca_config_dir=args.oca_config_dir,
            aws_efa_topology_file=args.aws_efa_topology_file,
        )


def add_flags(parser: argparse.ArgumentParser, env: Mapping[str, str] | None = None) -> None:
    """The cloud provider flags (dranet's names where dranet has the flag). Endpoint
    defaults can also come from the environment, so tests and odd networks can
    point a provider elsewhere without a flag."""
    env = os.environ if env is None else env
    g = parser.add_argument_group("cloud providers")
    hints = ", ".join(h.value for h in Hint)
    g.add_argument(
        "--cloud-provider-hint",
        default=env.get("DRANET_CLOUD_PROVIDER_HINT", ""),
        help=f"cloud provider to use ({hints}); empty detects it, NONE disables cloud providers",
    )
    g.add_argument(
        "--profile-provider",
        default=env.get("DRANET_PROFILE_PROVIDER", ProfileSource.CLOUD.value),
        help="who resolves profiles: cloud (the cloud provider's own), webhook, or none",
    )
    g.add_argument(
        "--webhook-url",
        default=env.get("DRANET_WEBHOOK_URL", ""),
        help="webhook provider URL: http://, https:// or unix:///path.sock",
    )
    g.add_argument(
        "--webhook-ca-file",
        default=env.get("DRANET_WEBHOOK_CA_FILE", ""),
        help="PEM CA bundle that signs an https webhook's certificate (default: the system roots)",
    )
    g.add_argument(
        "--webhook-timeout", type=float, default=webhook.DEFAULT_TIMEOUT, help="seconds per webhook call"
    )
    g.add_argument(
        "--cloud-detect-timeout",
        type=float,
        default=5.0,
        help="overall seconds cloud detection may take at start-up",
    )
    g.add_argument(
        "--cloud-startup-timeout",
        type=float,
        default=10.0,
        help="seconds start-up waits for cloud metadata; loading goes on in the background after that",
    )
    g.add_argument(
        "--cloud-request-timeout", type=float, default=2.0, help="seconds per metadata request attempt"
    )
    g.add_argument(
        "--cloud-request-deadline",
        type=float,
        default=10.0,
        help="seconds one metadata read may take with its retries",
    )
    g.add_argument(
        "--gce-metadata-url",
        default=env.get("DRANET_GCE_METADATA_URL") or gce.default_url(env),
        help="GCE metadata server base URL (GCE_METADATA_HOST is honoured)",
    )
    g.add_argument(
        "--aws-metadata-url",
        default=env.get("DRANET_AWS_METADATA_URL")
        or env.get("AWS_EC2_METADATA_SERVICE_ENDPOINT")
        or aws.DEFAULT_URL,
        help="EC2 IMDS base URL (AWS_EC2_METADATA_SERVICE_ENDPOINT is honoured)",
    )
    g.add_argument(
        "--azure-metadata-url",
        default=env.get("DRANET_AZURE_METADATA_URL", azure.DEFAULT_URL),
        help="Azure IMDS base URL",
    )
    g.add_argument(
        "--oke-metadata-url",
        default=env.get("DRANET_OKE_METADATA_URL", oke.DEFAULT_URL),
        help="OCI IMDS base URL",
    )
    g.add_argument(
        "--alibaba-metadata-url",
        default=env.get("DRANET_ALIBABA_METADATA_URL", alibaba.DEFAULT_URL),
        help="Alibaba ECS metadata base URL",
    )
    g.add_argument(
        "--cloud-state-dir",
        default=env.get("DRANET_CLOUD_STATE_DIR", "/var/lib/dranet/inventory"),
        help="directory for the profile address leases (empty keeps them in memory only)",
    )
    g.add_argument(
        "--oca-config-dir",
        default=oke.DEFAULT_OCA_CONFIG_DIR,
        help="OKE: Oracle Cloud Agent RDMA configuration directory (rdma_network.json, rdma_features_enable.json)",
    )
    g.add_argument(
        "--aws-efa-topology-file",
        default="",
        help="AWS: JSON map Neuron device index -> EFA PCI address for instance types without a built-in one",
    )


async def detect(options: CloudOptions, *, node_labels: coreweave.NodeLabels | None = None) -> Hint:
    """The cloud this node runs on, NONE when no probe confirms one in time."""
    pol = options.detect_policy
    url = options.webhook_url
    probes = {
        Hint.GCE.value: lambda: gce.probe(options.gce_url, pol),
        Hint.AWS.value: lambda: aws.probe(options.aws_url, pol),
        Hint.AZURE.value: lambda: azure.probe(options.azure_url, pol),
        Hint.OKE.value: lambda: oke.probe(options.oke_url, pol),
        Hint.ALIBABA.value: lambda: alibaba.probe(options.alibaba_url, pol),
        Hint.CKS.value: lambda: coreweave.probe(node_labels),
        Hint.WEBHOOK.value: lambda: webhook.probe(url, ca_file=options.webhook_ca_file, policy=pol),
    }
    found = await first_true(probes, [h.value for h in DETECTION_ORDER], options.detect_timeout)
    hint = Hint(found) if found else Hint.NONE
    log.info("cloud provider detected", extra={"hint": hint.value})
    return hint


def build_cloud(
    hint: Hint,
    options: CloudOptions,
    *,
    host: HostProbe,
    node_name: str = "",
    node_labels: coreweave.NodeLabels | None = None,
) -> CloudProvider | None:
    """The provider for ``hint`` (not started yet); None for NONE."""
    pol = options.policy
    timeout = options.startup_timeout
    leases = LeaseStore(os.path.join(options.state_dir, LEASE_FILE) if options.state_dir else "")
    if hint is Hint.GCE:
        return gce.GceProvider(options.gce_url, policy=pol, startup_timeout=timeout, leases=leases)
    if hint is Hint.AWS:
        return aws.AwsProvider(
            options.aws_url,
            host=host,
            policy=pol,
            startup_timeout=timeout,
            topology_file=options.aws_efa_topology_file,
        )
    if hint is Hint.AZURE:
        return azure.AzureProvider(options.azure_url, host=host, policy=pol, startup_timeout=timeout)
    if hint is Hint.OKE:
        return oke.OkeProvider(
            options.oke_url,
            host=host,
            policy=pol,
            startup_timeout=timeout,
            oca_config_dir=options.oca_config_dir,
        )
    if hint is Hint.ALIBABA:
        return alibaba.AlibabaProvider(options.alibaba_url, host=host, policy=pol, startup_timeout=timeout)
    if hint is Hint.CKS:
        if node_labels is None:
            raise ProviderError("cks: the CKS provider needs the Kubernetes API to read the Node's labels")
        return coreweave.CksProvider(node_labels, node_name, host=host, startup_timeout=timeout)
    if hint is Hint.WEBHOOK:
        return _webhook_provider(options)
    return None


def _webhook_provider(options: CloudOptions) -> webhook.WebhookProvider:
    return webhook.WebhookProvider(
        options.webhook_url,
        ca_file=options.webhook_ca_file,
        timeout=options.webhook_timeout,
        startup_timeout=options.startup_timeout,
    )


async def setup_providers(
    options: CloudOptions,
    *,
    host: HostProbe | None = None,
    node_name: str = "",
    node_labels: coreweave.NodeLabels | None = None,
) -> Providers:
    """Detect (unless hinted), start the cloud provider and pick the profile provider.

    Like dranet, a cloud provider that cannot be set up is logged and left out (the
    node publishes without cloud attributes), while an unusable profile provider
    that was asked for explicitly (--profile-provider=webhook) is an error: the
    service should not run half configured. Bounded by roughly
    detect_timeout + startup_timeout.
    """
    host = host or HostProbe()
    if options.profile_provider is ProfileSource.WEBHOOK and not options.webhook_url:
        raise ProviderError("--webhook-url is required when --profile-provider=webhook")
    hint = options.hint
    if hint is None:
        hint = await detect(options, node_labels=node_labels)
    cloud: CloudProvider | None = None
    try:
        cloud = build_cloud(hint, options, host=host, node_name=node_name, node_labels=node_labels)
        if cloud is not None:
            await cloud.start()
    except ProviderError as exc:
        log.error("cloud provider not available", extra={"hint": hint.value, "error": str(exc)})
        if cloud is not None:
            await cloud.close()
        cloud = None
    hooked: webhook.WebhookProvider | None = cloud if isinstance(cloud, webhook.WebhookProvider) else None
    if hooked is not None and hooked.capabilities is not None and not hooked.capabilities.cloud_provider:
        # The webhook answers profiles only: it is not a cloud provider (dranet: nil instance).
        cloud = None

    profiles: ProfileProvider | None = None
    if options.profile_provider is ProfileSource.CLOUD:
        profiles = cloud if isinstance(cloud, ProfileProvider) else None
    elif options.profile_provider is ProfileSource.WEBHOOK:
        if hooked is None:
            hooked = _webhook_provider(options)
            try:
                await hooked.start()
            except ProviderError:
                await hooked.close()
                if cloud is not None:
                    await cloud.close()
                raise
        assert hooked.capabilities is not None
        if not hooked.capabilities.profile_provider:
            await hooked.close()
            if cloud is not None and cloud is not hooked:
                await cloud.close()
            raise ProviderError(
                f"webhook {options.webhook_url} does not offer profiles (profileProvider is false)"
            )
        profiles = hooked
    if hooked is not None and hooked is not cloud and hooked is not profiles:
        await hooked.close()
    log.info(
        "cloud providers ready",
        extra={
            "hint": hint.value,
            "cloud_provider": cloud.name if cloud is not None else "none",
            "profile_provider": profiles.name if profiles is not None else "none",
            "metadata_loaded": bool(cloud and cloud.ready),
        },
    )
    return Providers(hint=hint, cloud=cloud, profiles=profiles)
