"""The NetworkConfig a claim's opaque parameters carry: model, parsing, defaulting,
validation, merge and the pick of one opaque config. Pure: no I/O."""

from shared.netconfig.errors import ConfigError, FieldError
from shared.netconfig.model import (
    Addressing,
    EthtoolConfig,
    InterfaceConfig,
    InterfaceType,
    NeighborConfig,
    NetworkConfig,
    RouteConfig,
    RuleConfig,
    VRFConfig,
    parse_network_config,
)

__all__ = [
    "Addressing",
    "ConfigError",
    "EthtoolConfig",
    "FieldError",
    "InterfaceConfig",
    "InterfaceType",
    "NeighborConfig",
    "NetworkConfig",
    "RouteConfig",
    "RuleConfig",
    "VRFConfig",
    "parse_network_config",
]
