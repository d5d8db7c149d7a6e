"""Cloud and profile providers of the inventory: GCE, AWS, Azure, Alibaba, OKE,
CoreWeave CKS and the webhook.

The inventory wires them like this::

    cloud.add_flags(parser)                                   # with its other flags
    options = cloud.CloudOptions.from_args(args)
    providers = await cloud.setup_providers(
        options, host=cloud.HostProbe(sysfs_root=..., netns=None),
        node_name=node, node_labels=cloud.kube_node_labels(api_client, node))
    views = await providers.describe(devices)                 # per scan: attributes, provider config, profiles
    ... ResolveProfile / ReleaseProfile -> cloud.rpc.resolve / cloud.rpc.release
    await providers.close()
"""

from services.inventory.cloud.base import (
    CloudProvider,
    CloudView,
    DeviceInfo,
    Hint,
    ProfileError,
    ProfileErrorCode,
    ProfileProvider,
    ProfileSource,
    ProviderError,
    Providers,
    advertised_profiles,
    strip_advertised_profile,
)
from services.inventory.cloud.coreweave import NodeLabels, kube_node_labels
from services.inventory.cloud.discovery import CloudOptions, add_flags, detect, setup_providers
from services.inventory.cloud.host import HostProbe
from shared.deviceattr import Attribute, AttrKind, attribute_problem

__all__ = [
    "AttrKind",
    "Attribute",
    "CloudOptions",
    "CloudProvider",
    "CloudView",
    "DeviceInfo",
    "Hint",
    "HostProbe",
    "NodeLabels",
    "ProfileError",
    "ProfileErrorCode",
    "ProfileProvider",
    "ProfileSource",
    "ProviderError",
    "Providers",
    "add_flags",
    "advertised_profiles",
    "attribute_problem",
    "detect",
    "kube_node_labels",
    "setup_providers",
    "strip_advertised_profile",
]
