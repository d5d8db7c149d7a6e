"""Pytest plugin: the real single-node cluster, one per test session.

``kube_cluster`` starts etcd, kube-apiserver, kube-controller-manager, kube-scheduler, a private
containerd with NRI and the kubelet on first use (``dev.cluster.kube``) and stops them all at the
end of the session, checking that nothing is left behind. Tests isolate by namespace (``kube``
gives each test a fresh one and deletes it, with its Pods, afterwards) and by NIC names.
Tests that use it carry the ``cluster`` marker.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from dev.cluster.kube import KubeCluster
from tests.support.kube import Kube


@pytest.fixture(scope="session")
def kube_cluster() -> Iterator[KubeCluster]:
    c = KubeCluster(node_name="node-a")
    try:
        c.start()
    except BaseException:
        print(c.dump_logs())
        c.stop()
        raise
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def kube(kube_cluster: KubeCluster) -> Iterator[Kube]:
    k = Kube(kube_cluster, f"t-{secrets.token_hex(3)}")
    k.create_namespace()
    try:
        yield k
    finally:
        k.delete_namespace()
        k.delete_device_classes()
