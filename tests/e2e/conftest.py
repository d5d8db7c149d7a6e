"""End-to-end tests on the real cluster: the session's KubeCluster (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, containerd with NRI, the kubelet) and dranet's four
services as real processes beside it (``dev.cluster.driver.Driver``).

- ``driver``: the four services for one test module, started once for it. A module may set
  ``DRIVER_ARGS = {"inventory_args": [...], "prepare_args": [...], "attach_args": [...]}`` or
  override the fixture (for example to start a fake metadata server first). Only one driver
  serves the node at a time (one ``dra.net`` plugin, one NRI plugin), as on a real node.
- ``kube`` (from tests/fixtures_cluster.py): a fresh namespace per test, deleted with its Pods.
- ``node``: the pair, for tests that need both.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from dev.cluster.driver import Driver
from dev.cluster.kube import KubeCluster
from proto.dranet.store.v1 import store_pb2 as st
from shared.storeclient import StoreClient
from tests.support.kube import Kube


def start_driver(cluster: KubeCluster, **kw: Any) -> Driver:
    d = Driver(cluster, workdir=cluster.state / f"driver-{secrets.token_hex(3)}", **kw)
    try:
        d.start()
    except BaseException:
        print(d.logs())
        d.stop()
        raise
    return d


def stop_driver(cluster: KubeCluster, d: Driver) -> None:
    # Pods go while attach runs, so their devices come back before the services stop.
    cluster.delete_pods()
    d.stop()


@pytest.fixture(scope="module")
def driver(kube_cluster: KubeCluster, request: pytest.FixtureRequest) -> Iterator[Driver]:
    d = start_driver(kube_cluster, **getattr(request.module, "DRIVER_ARGS", {}))
    try:
        yield d
    except BaseException:
        print(d.logs())
        raise
    finally:
        stop_driver(kube_cluster, d)


@dataclass
class Node:
    kube: Kube
    driver: Driver

    @property
    def cluster(self) -> KubeCluster:
        return self.kube.c

    def store(self) -> StoreClient:
        """A client of the driver's store (close it, or use ``async with``)."""
        return StoreClient(self.driver.run_dir / "store.sock")

    async def stored(self, claim_uid: str) -> list[st.DeviceConfig]:
        """The DeviceConfigs the store holds for a claim."""
        store = self.store()
        try:
            return list((await store.list(claim_uid=claim_uid)).devices)
        finally:
            await store.close()


@pytest.fixture
def node(kube: Kube, driver: Driver, request: pytest.FixtureRequest) -> Iterator[Node]:
    yield Node(kube, driver)
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        print(driver.logs())  # shown with the failure


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    rep = yield
    if rep.when == "call":
        item.rep_call = rep  # type: ignore[attr-defined]
    return rep
