"""The loading lifecycle every metadata-backed cloud provider shares: one fetch
at start-up bounded by a deadline, then background retries with backoff until a
fetch succeeds, optional periodic refreshes, and listeners told about changes.

dranet polls for up to 15 s in GetInstance and gives up; here start-up waits at
most ``startup_timeout`` and the provider keeps trying afterwards, so attributes
appear as soon as the metadata server does.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import random
from typing import Generic, TypeVar

from services.inventory.cloud.base import CloudProvider, Listener, ProviderError
from services.inventory.cloud.metadata import HttpClient

log = logging.getLogger(__name__)

S = TypeVar("S")


class PartialMetadata(ProviderError, Generic[S]):
    """Raised by ``fetch`` when part of the metadata was read: ``state`` is stored
    and used, and loading keeps retrying for the rest."""

    def __init__(self, state: S, message: str) -> None:
        super().__init__(message)
        self.state = state


class MetadataProvider(CloudProvider, Generic[S]):
    """A CloudProvider whose knowledge is one immutable snapshot ``S`` fetched from
    metadata. Subclasses implement ``fetch`` and read ``self.state``."""

    def __init__(
        self,
        *,
        startup_timeout: float,
        retry_max_interval: float = 60.0,
        refresh_interval: float | None = None,
    ) -> None:
        self.startup_timeout = startup_timeout
        self.retry_max_interval = retry_max_interval
        self.refresh_interval = refresh_interval
        self._state: S | None = None
        self._loaded = asyncio.Event()
        self._listeners: list[Listener] = []
        self._task: asyncio.Task[None] | None = None
        self.last_error: str = ""

    @abc.abstractmethod
    async def fetch(self) -> S:
        """Read the metadata once (bounded by the client's deadline). Raise
        ProviderError when it cannot be read."""

    async def close_clients(self) -> None:
        """Close HTTP sessions."""

    @property
    def state(self) -> S | None:
        return self._state

    @property
    def ready(self) -> bool:
        return self._loaded.is_set()

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def _store(self, state: S) -> None:
        changed = state != self._state
        self._state = state
        first = not self._loaded.is_set()
        self._loaded.set()
        if first:
            log.info("cloud metadata loaded", extra={"provider": self.name})
        if changed:
            for listener in list(self._listeners):
                try:
                    listener()
                except Exception:
                    log.exception("cloud metadata listener failed", extra={"provider": self.name})

    async def _try_fetch(self) -> bool:
        try:
            state = await self.fetch()
        except PartialMetadata as partial:
            self.last_error = str(partial)
            self._store(partial.state)
            return False
        except ProviderError as exc:
            self.last_error = str(exc)
            return False
        except Exception as exc:
            # A parsing bug must not kill the loader silently; keep retrying and say why.
            log.exception("cloud metadata fetch failed unexpectedly", extra={"provider": self.name})
            self.last_error = f"{type(exc).__name__}: {exc}"
            return False
        self.last_error = ""
        self._store(state)
        return True

    async def _run(self) -> None:
        backoff = 1.0
        while not await self._try_fetch():
            log.info(
                "cloud metadata not available yet, retrying",
                extra={"provider": self.name, "error": self.last_error, "retry_in_s": backoff},
            )
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.retry_max_interval)
        if not self.refresh_interval:
            return
        while True:
            await asyncio.sleep(self.refresh_interval * random.uniform(0.9, 1.1))
            if not await self._try_fetch():
                log.warning(
                    "cloud metadata refresh failed, keeping the last values",
                    extra={"provider": self.name, "error": self.last_error},
                )

    async def start(self) -> None:
        if self._task is not None:
            return
        self._task = asyncio.create_task(self._run(), name=f"cloud-metadata-{self.name}")
        try:
            async with asyncio.timeout(self.startup_timeout):
                await self._loaded.wait()
        except TimeoutError:
            log.warning(
                "cloud metadata not loaded within the start-up deadline, continuing in the background",
                extra={"provider": self.name, "timeout_s": self.startup_timeout, "error": self.last_error},
            )

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.close_clients()


class HttpMetadataProvider(MetadataProvider[S]):
    """A MetadataProvider that reads one instance metadata server through ``client``,
    whose session it closes with the provider."""

    def __init__(
        self, client: HttpClient, *, startup_timeout: float, refresh_interval: float | None = None
    ) -> None:
        super().__init__(startup_timeout=startup_timeout, refresh_interval=refresh_interval)
        self.client = client

    async def close_clients(self) -> None:
        await self.client.close()
