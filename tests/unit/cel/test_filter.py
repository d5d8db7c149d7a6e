"""dranet's publish-time --filter (shared.cel), mirroring dranet pkg/filter's cases."""

from __future__ import annotations

from typing import Any

import pytest

from services.inventory.discovery import Device
from services.inventory.filter import DeviceFilter, apply_filter
from shared import cel


def device(device_name: str, **attributes: dict[str, Any]) -> dict[str, Any]:
    return {"name": device_name, "attributes": attributes}


NETWORK_ETH0 = device("dev1", kind={"string": "network"}, name={"string": "eth0"}, type={"string": "veth"})
RDMA_ETH1 = device("dev2", kind={"string": "rdma"}, name={"string": "eth1"}, type={"string": "veth"})

CASES = [
    # (expression or None, devices, names kept)
    (None, [device("dev1")], ["dev1"]),
    ('attributes["kind"].StringValue == "network"', [NETWORK_ETH0, RDMA_ETH1], ["dev1"]),
    (
        'attributes["kind"].StringValue == "network" && attributes["name"].StringValue == "eth0"',
        [NETWORK_ETH0, RDMA_ETH1],
        ["dev1"],
    ),
    ('attributes["type"].StringValue  != "veth"', [NETWORK_ETH0, RDMA_ETH1], []),
    (
        'attributes["virtual"].BoolValue',
        [device("dev1", virtual={"bool": True}), device("dev2", virtual={"bool": True})],
        ["dev1", "dev2"],
    ),
    ('attributes["kind"].StringValue == "network"', [], []),
    ("true", [RDMA_ETH1, NETWORK_ETH0], ["dev2", "dev1"]),
    # an evaluation error publishes the device (dranet keeps it and logs)
    (
        '(1 / attributes["divisor"].IntValue) == 1',
        [
            device("div0", divisor={"int": 0}),
            device("div2", divisor={"int": 2}),
            device("div1", divisor={"int": 1}),
        ],
        ["div0", "div1"],
    ),
    (
        'attributes["dra.net/type"].StringValue != "veth"',
        [
            device("missing", some_other_key={"string": "value"}),
            device("eth0", **{"dra.net/type": {"string": "eth0"}}),
            device("veth", **{"dra.net/type": {"string": "veth"}}),
        ],
        ["missing", "eth0"],
    ),
    # dranet's default filter: hide veth
    (
        '!("dra.net/type" in attributes) || attributes["dra.net/type"].StringValue  != "veth"',
        [
            device("no-type"),
            device("veth0", **{"dra.net/type": {"string": "veth"}}),
            device("eth0", **{"dra.net/type": {"string": "device"}}),
        ],
        ["no-type", "eth0"],
    ),
    # the GKE example from dranet's docs
    (
        'attributes["dra.net/virtual"].BoolValue == false',
        [
            device("v", **{"dra.net/virtual": {"bool": True}}),
            device("p", **{"dra.net/virtual": {"bool": False}}),
        ],
        ["p"],
    ),
    # unset Go pointer fields read as zero values, as cel-go native types do
    (
        'attributes["mtu"].StringValue == "" && attributes["mtu"].IntValue == 1500',
        [device("d", mtu={"int": 1500})],
        ["d"],
    ),
    (
        'has(attributes["mtu"].IntValue) && !has(attributes["mtu"].StringValue)',
        [device("d", mtu={"int": 1500})],
        ["d"],
    ),
    ('attributes["numa"].IntValues == [0, 1]', [device("d", numa={"ints": [0, 1]})], ["d"]),
    # a non-bool result does not publish
    ('attributes["kind"].StringValue', [NETWORK_ETH0], []),
]


@pytest.mark.parametrize(("expression", "devices", "kept"), CASES)
async def test_filter_cases(expression: str | None, devices: list[dict[str, Any]], kept: list[str]) -> None:
    """The cases through the inventory's filter, the one user of shared.cel."""
    flt = DeviceFilter(expression) if expression is not None else None
    result = await apply_filter(flt, [Device.from_slice_entry(d) for d in devices])
    assert [d.name for d in result] == kept


def test_evaluation_error_and_non_bool_result() -> None:
    program = cel.compile_filter('attributes["dra.net/type"].StringValue != "veth"')
    with pytest.raises(cel.CelEvalError, match=r"no such key: dra\.net/type"):
        program.evaluate(cel.filter_variables(device("x")))
    program = cel.compile_filter('attributes["kind"].StringValue')
    assert program.evaluate(cel.filter_variables(NETWORK_ETH0)) == "network"


COMPILE_ERRORS = [
    # dranet's environment is a bare cel-go env with the DeviceAttribute native type
    ('attributes["type"].Value == "veth"', "undefined field 'Value'"),
    ('attributes["type"].StringValue.lowerAscii() == "veth"', "undeclared reference to 'lowerAscii'"),
    ('device.driver == "dra.net"', "undeclared reference to 'device'"),
    ('attributes["type"].StringValue == 1', "no matching overload for '_==_'"),
    ('attributes["type"].StringValue ==', "syntax error"),
]


@pytest.mark.parametrize(("expression", "reason"), COMPILE_ERRORS)
def test_filter_compile_errors(expression: str, reason: str) -> None:
    with pytest.raises(cel.CelCompileError, match=reason.replace("(", r"\(")):
        cel.compile_filter(expression)
