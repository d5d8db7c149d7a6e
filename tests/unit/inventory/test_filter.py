"""The publish-time --filter: dranet's default, its error rules and the result cache."""

from __future__ import annotations

import pytest

from services.inventory import attributes as A
from services.inventory.discovery import Device
from services.inventory.filter import (
    DEFAULT_FILTER,
    DeviceFilter,
    FilterError,
    apply_filter,
    referenced_attributes,
)
from shared.deviceattr import Attribute


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


class CountingFilter(DeviceFilter):
    """Counts real evaluations."""

    def __init__(self, expression: str) -> None:
        super().__init__(expression, native_default=False)
        self.evaluations = 0
        real = self.program

        class Program:
            def evaluate(inner, variables):  # type: ignore[no-untyped-def]
                self.evaluations += 1
                return real.evaluate(variables)

        self.program = Program()  # type: ignore[assignment]


def veth(name: str, mtu: int, kind: str = "veth") -> Device:
    return device(name, **{"dra.net__type": Attribute.of_string(kind), "dra.net__mtu": Attribute.of_int(mtu)})


def test_literal_reads_key_the_cache_on_those_attributes_only() -> None:
    flt = CountingFilter(DEFAULT_FILTER)
    assert [flt.keep(veth(f"v{i}", 1500 + i)) for i in range(100)] == [False] * 100
    assert flt.evaluations == 1  # only dra.net/type matters
    assert flt.keep(veth("b", 1500, kind="bridge")) is True and flt.evaluations == 2


def test_other_expressions_key_the_cache_on_every_attribute() -> None:
    flt = CountingFilter("size(attributes) > 1")
    assert flt.keep(veth("a", 1500)) and flt.keep(veth("b", 1500))
    assert flt.evaluations == 1
    assert flt.keep(veth("c", 9000)) and flt.evaluations == 2


@pytest.mark.parametrize(
    ("expression", "want"),
    [
        (DEFAULT_FILTER, {"dra.net/type"}),
        ("attributes['dra.net/rdma'].BoolValue", {"dra.net/rdma"}),
        ('"x" in attributes && attributes[ "y" ].IntValue > 1', {"x", "y"}),
        ("true", set()),
        ("attributes.exists(k, k.startsWith('dra.net/'))", None),
        ("size(attributes) > 2", None),
        ('attributes["dra.net/" + "type"].StringValue == "veth"', None),
        ('attributes["a\\"b"].StringValue == ""', None),
        ('attributes["x"].StringValue == "attributes"', None),
    ],
)
def test_referenced_attributes(expression: str, want: set[str] | None) -> None:
    got = referenced_attributes(expression)
    assert (set(got) if got is not None else None) == want


async def test_no_filter_publishes_everything() -> None:
    assert await apply_filter(None, [VETH, NIC]) == [VETH, NIC]


def test_attribute_names_are_the_published_ones() -> None:
    assert A.TYPE == "dra.net/type" and A.RDMA == "dra.net/rdma"


ODD_TYPES = [
    device("t-int", **{"dra.net__type": Attribute.of_int(3)}),
    device("t-empty", **{"dra.net__type": Attribute.of_string("")}),
    device("t-VETH", **{"dra.net__type": Attribute.of_string("VETH")}),
    device("t-veth-space", **{"dra.net__type": Attribute.of_string("veth ")}),
    device("t-bool", **{"dra.net__type": Attribute.of_bool(False)}),
    device("t-other-attr", **{"dra.net__kind": Attribute.of_string("veth")}),
]


async def test_the_default_is_decided_without_cel_and_agrees_with_it() -> None:
    native = DeviceFilter(DEFAULT_FILTER)
    spaced = DeviceFilter(DEFAULT_FILTER.replace(" ", "  ").replace("||", "\n||"))
    with_cel = DeviceFilter(DEFAULT_FILTER, native_default=False)
    assert native.native and spaced.native and not with_cel.native and with_cel.program is not None
    devices = [VETH, NIC, BARE, *ODD_TYPES]
    want = [d.name for d in await with_cel.apply(devices)]
    assert want == [d.name for d in devices if d.name != "veth0"]
    assert [d.name for d in await native.apply(devices)] == want
    assert [d.name for d in await spaced.apply(devices)] == want


def test_the_inventory_with_the_default_filter_does_not_load_cel() -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from services.inventory.filter import DEFAULT_FILTER, DeviceFilter\n"
        "import services.inventory.__main__\n"
        "DeviceFilter(DEFAULT_FILTER)\n"
        "print(sorted(m for m in ('celpy', 'lark', 'shared.cel') if m in sys.modules))\n"
        "DeviceFilter('true')\n"
        "print(sorted(m for m in ('celpy', 'lark', 'shared.cel') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["[]", "['celpy', 'lark', 'shared.cel']"]
