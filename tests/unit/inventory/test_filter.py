"""The publish-time --filter: dranet's default, its error rules and the result cache."""

from __future__ import annotations

import pytest

from services.inventory import attributes as A
from services.inventory.cloud.base import Attribute
from services.inventory.discovery import Device
from services.inventory.filter import DEFAULT_FILTER, DeviceFilter, FilterError, apply_filter


def device(name: str, **attrs: Attribute) -> Device:
    return Device(name=name, attributes={k.replace("__", "/"): v for k, v in attrs.items()})


VETH = device(
    "veth0", **{"dra.net__type": Attribute.of_string("veth"), "dra.net__mtu": Attribute.of_int(1500)}
)
NIC = device(
    "pci-0000-3b-00-0",
    **{"dra.net__type": Attribute.of_string("device"), "dra.net__rdma": Attribute.of_bool(True)},
)
BARE = device("pci-0000-5e-00-0", **{"dra.net__rdma": Attribute.of_bool(True)})  # RDMA-only: no type


async def test_default_hides_veth_only() -> None:
    flt = DeviceFilter(DEFAULT_FILTER)
    assert [d.name for d in await flt.apply([VETH, NIC, BARE])] == ["pci-0000-3b-00-0", "pci-0000-5e-00-0"]


@pytest.mark.parametrize(
    ("expression", "want"),
    [
        (
            '"dra.net/rdma" in attributes && attributes["dra.net/rdma"].BoolValue',
            ["pci-0000-3b-00-0", "pci-0000-5e-00-0"],
        ),
        # A non-bool result drops every device.
        ('"x"', []),
        ('"dra.net/mtu" in attributes && attributes["dra.net/mtu"].IntValue >= 1500', ["veth0"]),
        # An unset field reads as its zero value, as with cel-go native types.
        (
            '"dra.net/type" in attributes && attributes["dra.net/type"].IntValue == 0',
            ["veth0", "pci-0000-3b-00-0"],
        ),
        # A runtime error (missing key) publishes the device, as dranet does.
        ('attributes["dra.net/type"].StringValue == "device"', ["pci-0000-3b-00-0", "pci-0000-5e-00-0"]),
    ],
)
async def test_expressions(expression: str, want: list[str]) -> None:
    got = await DeviceFilter(expression).apply([VETH, NIC, BARE])
    assert [d.name for d in got] == want


def test_bad_expression_fails_with_a_message() -> None:
    with pytest.raises(FilterError, match=r"--filter: .*syntax error"):
        DeviceFilter('attributes["dra.net/type"].StringValue ==')
    with pytest.raises(FilterError, match="--filter"):
        DeviceFilter("nosuchvariable == 1")


def test_results_are_cached_by_attributes() -> None:
    flt = DeviceFilter(DEFAULT_FILTER)
    assert flt.keep(VETH) is False
    calls = []
    real = flt.program.evaluate
    flt.program = type("P", (), {"evaluate": lambda self, v: calls.append(v) or real(v)})()  # type: ignore[assignment]
    assert (
        flt.keep(
            device(
                "other-name",
                **{"dra.net__type": Attribute.of_string("veth"), "dra.net__mtu": Attribute.of_int(1500)},
            )
        )
        is False
    )
    assert calls == []  # same attributes: no evaluation
    changed = device(
        "veth0", **{"dra.net__type": Attribute.of_string("veth"), "dra.net__mtu": Attribute.of_int(9000)}
    )
    assert flt.keep(changed) is False and len(calls) == 1


async def test_no_filter_publishes_everything() -> None:
    assert await apply_filter(None, [VETH, NIC]) == [VETH, NIC]


def test_attribute_names_are_the_published_ones() -> None:
    assert A.TYPE == "dra.net/type" and A.RDMA == "dra.net/rdma"
