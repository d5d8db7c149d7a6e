"""Our kubelet protos (plugin registration, DRA v1 and v1beta1) against the
upstream wire facts of k8s.io/kubelet (pkg/apis/pluginregistration/v1 and
pkg/apis/dra/v1 and v1beta1 api.proto)."""

from __future__ import annotations

import pytest

from proto.kubelet.dra.v1 import dra_pb2 as dra_v1
from proto.kubelet.dra.v1beta1 import dra_pb2 as dra_v1beta1
from proto.kubelet.pluginregistration.v1 import registration_pb2
from tests.unit.proto.test_nri_wire import check_messages, method_paths

REGISTRATION_MESSAGES = {
    "InfoRequest": "",
    "PluginInfo": "type=1 string; name=2 string; endpoint=3 string; supported_versions=4 repeated string",
    "RegistrationStatus": "plugin_registered=1 bool; error=2 string",
    "RegistrationStatusResponse": "",
}


def test_plugin_registration() -> None:
    assert registration_pb2.DESCRIPTOR.package == "pluginregistration"
    assert method_paths(registration_pb2.DESCRIPTOR) == {
        "/pluginregistration.Registration/GetInfo": (
            "pluginregistration.InfoRequest",
            "pluginregistration.PluginInfo",
        ),
        "/pluginregistration.Registration/NotifyRegistrationStatus": (
            "pluginregistration.RegistrationStatus",
            "pluginregistration.RegistrationStatusResponse",
        ),
    }
    assert set(registration_pb2.DESCRIPTOR.message_types_by_name) == set(REGISTRATION_MESSAGES)
    check_messages(registration_pb2, REGISTRATION_MESSAGES)


DRA_COMMON = {
    "NodePrepareResourcesRequest": "claims=1 repeated Claim",
    "NodePrepareResourcesResponse": "claims=1 map<string,NodePrepareResourceResponse>",
    "NodePrepareResourceResponse": "devices=1 repeated Device; error=2 string",
    "NodeUnprepareResourcesRequest": "claims=1 repeated Claim",
    "NodeUnprepareResourcesResponse": "claims=1 map<string,NodeUnprepareResourceResponse>",
    "NodeUnprepareResourceResponse": "error=1 string",
    "Claim": "namespace=1 string; uid=2 string; name=3 string",
}
DEVICE_V1BETA1 = "request_names=1 repeated string; pool_name=2 string; device_name=3 string; cdi_device_ids=4 repeated string"
# share_id (kubelet v0.35+) is a proto3 `optional` field and exists only in v1.
DEVICE_V1 = DEVICE_V1BETA1 + "; share_id=5 optional string"


@pytest.mark.parametrize(
    ("module", "package", "device"),
    [
        (dra_v1, "k8s.io.kubelet.pkg.apis.dra.v1", DEVICE_V1),
        (dra_v1beta1, "k8s.io.kubelet.pkg.apis.dra.v1beta1", DEVICE_V1BETA1),
    ],
)
def test_dra_plugin(module: object, package: str, device: str) -> None:
    fd = module.DESCRIPTOR  # type: ignore[attr-defined]
    assert fd.package == package
    assert method_paths(fd) == {
        f"/{package}.DRAPlugin/NodePrepareResources": (
            f"{package}.NodePrepareResourcesRequest",
            f"{package}.NodePrepareResourcesResponse",
        ),
        f"/{package}.DRAPlugin/NodeUnprepareResources": (
            f"{package}.NodeUnprepareResourcesRequest",
            f"{package}.NodeUnprepareResourcesResponse",
        ),
    }
    table = {**DRA_COMMON, "Device": device}
    assert set(fd.message_types_by_name) == set(table)
    check_messages(module, table)


def test_share_id_has_presence() -> None:
    d = dra_v1.Device(pool_name="p", device_name="d")
    assert not d.HasField("share_id")
    d.share_id = ""
    assert d.HasField("share_id")
    # An explicitly set empty string is on the wire (field 5, length 0).
    assert d.SerializeToString().endswith(b"\x2a\x00")


def test_v1beta1_reads_what_v1_writes() -> None:
    """v1beta1 is a strict subset of v1: a v1 message parses as v1beta1 with share_id dropped."""
    v1 = dra_v1.NodePrepareResourcesResponse()
    res = v1.claims["uid-1"]
    res.devices.add(
        request_names=["nic"], pool_name="node-a", device_name="eth1", cdi_device_ids=["x/y=z"], share_id="s"
    )
    beta = dra_v1beta1.NodePrepareResourcesResponse.FromString(v1.SerializeToString())
    dev = beta.claims["uid-1"].devices[0]
    assert (list(dev.request_names), dev.pool_name, dev.device_name, list(dev.cdi_device_ids)) == (
        ["nic"],
        "node-a",
        "eth1",
        ["x/y=z"],
    )
