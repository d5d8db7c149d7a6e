"""A small NRI client for Python: ttrpc framing, NRI's connection multiplexer,
and a plugin stub that registers with the container runtime and dispatches its
calls to async hooks."""

from services.attach.nri.stub import (
    DEFAULT_SOCKET_PATH,
    NriHandlers,
    NriStub,
    RuntimeInfo,
    StubConfig,
    event_mask,
    implemented_events,
)
from services.attach.nri.ttrpc import Code, TtrpcError

__all__ = [
    "DEFAULT_SOCKET_PATH",
    "Code",
    "NriHandlers",
    "NriStub",
    "RuntimeInfo",
    "StubConfig",
    "TtrpcError",
    "event_mask",
    "implemented_events",
]
