"""DRA selector CEL (shared.cel, Env.DRA): inputs and expected results side by side."""

from __future__ import annotations

import re
import threading
from typing import Any

import pytest

from shared import cel

DRIVER = "dra.net"

# A device as dranet publishes it (resource.k8s.io/v1 JSON), plus a foreign-domain attribute, an
# unqualified one (driver domain), a version and a capacity.
ETH1: dict[str, Any] = {
    "name": "eth1",
    "attributes": {
        "dra.net/ifName": {"string": "eth1"},
        "dra.net/rdma": {"bool": True},
        "dra.net/mtu": {"int": 9000},
        "dra.net/numaNode": {"int": 0},
        "dra.net/pciAddress": {"string": "0000:00:04.0"},
        "dra.net/ipv4": {"string": "10.0.1.5"},
        "dra.net/type": {"string": "device"},
        "dra.net/virtual": {"bool": False},
        "firmware": {"version": "1.10.2"},
        "gpu.example.com/model": {"string": "A100"},
    },
    "capacity": {"bandwidth": {"value": "100G"}, "dra.net/queues": {"value": "8"}},
}

VARS = cel.dra_device_variables(ETH1, DRIVER)

MATCHES = [
    # dranet selectors
    ('device.attributes["dra.net"].ifName == "eth1"', True),
    ('device.attributes["dra.net"].ifName == "eth2"', False),
    ('device.attributes["dra.net"].rdma == true', True),
    ('device.driver == "dra.net"', True),
    ('device.driver == "dra.net" && device.attributes["dra.net"].rdma == true', True),
    ('device.attributes["dra.net"].virtual == false && device.attributes["dra.net"].type != "veth"', True),
    ('device.attributes["dra.net"].mtu >= 9000 && device.attributes["dra.net"].numaNode == 0', True),
    ('device.attributes["dra.net"].pciAddress.startsWith("0000:00:")', True),
    ('device.attributes["dra.net"].ifName.matches("^eth[0-9]+$")', True),
    ('device.attributes["dra.net"].ifName in ["eth0", "eth1"]', True),
    # unqualified names belong to the driver's domain; other domains keep theirs
    ('device.attributes["dra.net"].firmware.isGreaterThan(semver("1.9.0"))', True),
    ('device.attributes["gpu.example.com"].model == "A100"', True),
    # semver: precedence is numeric, not lexical; pre-releases rank lower
    ('device.attributes["dra.net"].firmware.compareTo(semver("1.2.0")) > 0', True),
    ('device.attributes["dra.net"].firmware.isLessThan(semver("1.10.3"))', True),
    ('device.attributes["dra.net"].firmware == semver("1.10.2")', True),
    (
        'device.attributes["dra.net"].firmware.major() == 1 && device.attributes["dra.net"].firmware.minor() == 10',
        True,
    ),
    ('semver("1.0.0-alpha.1").isLessThan(semver("1.0.0-alpha.beta"))', True),
    ('semver("1.0.0-rc.1").isLessThan(semver("1.0.0"))', True),
    ('semver("1.0.0+build.5") == semver("1.0.0")', True),
    ('isSemver("1.2.3") && !isSemver("v1.2") && isSemver("v1.2", true)', True),
    ('semver("v01.2", true) == semver("1.2.0")', True),
    # quantities
    ('device.capacity["dra.net"].bandwidth.compareTo(quantity("10G")) > 0', True),
    ('device.capacity["dra.net"].queues.asInteger() == 8', True),
    ('quantity("1Gi").isGreaterThan(quantity("1G"))', True),
    ('quantity("1500m").isInteger() == false && quantity("1500m").asApproximateFloat() == 1.5', True),
    (
        'quantity("1k").add(24).asInteger() == 1024 && quantity("1Ki").sub(quantity("24")).asInteger() == 1000',
        True,
    ),
    ('isQuantity("10Mi") && !isQuantity("10MB") && sign(quantity("-1")) == -1', True),
    # unknown domain reads as an empty map: `in`, has() and size() are safe on it
    ('"rdma" in device.attributes["other.example.com"]', False),
    ('has(device.attributes["dra.net"].rdma) && !has(device.attributes["dra.net"].sriov)', True),
    ('size(device.attributes["other.example.com"]) == 0', True),
    ('size(device.capacity["other.example.com"]) == 0', True),
    ('"dra.net" in device.attributes && !("other.example.com" in device.attributes)', True),
    # cel-go strings extension (missing from celpy)
    ('device.attributes["dra.net"].ifName.upperAscii() == "ETH1"', True),
    ('"ETH1".lowerAscii() == "eth1"', True),
    ('"0000:00:04.0".split(":") == ["0000", "00", "04.0"]', True),
    ('"a:b:c".split(":", 2) == ["a", "b:c"] && "abc".split("") == ["a", "b", "c"]', True),
    ('["a", "b"].join("-") == "a-b" && ["a", "b"].join() == "ab"', True),
    ('"hello".charAt(1) == "e" && "hello".indexOf("l") == 2 && "hello".lastIndexOf("l") == 3', True),
    ('"  x ".trim() == "x" && "aXa".replace("a", "b") == "bXb" && "hello".substring(1, 3) == "el"', True),
    # regex library
    ('device.attributes["dra.net"].ifName.find("[0-9]+") == "1"', True),
    ('"a1b22".findAll("[0-9]+") == ["1", "22"]', True),
    # lists and sets libraries
    ("[1, 2, 3].isSorted() && [1, 2, 3].sum() == 6 && [3, 1, 2].min() == 1 && [3, 1, 2].max() == 3", True),
    ("[1, 2, 3].indexOf(2) == 1 && [1, 2, 1].lastIndexOf(1) == 2", True),
    (
        "sets.contains([1, 2, 3], [2, 3]) && sets.intersects([1], [1, 5]) && sets.equivalent([1, 2], [2, 1])",
        True,
    ),
    # ip / cidr library over dranet's address attributes
    ('cidr("10.0.0.0/16").containsIP(device.attributes["dra.net"].ipv4)', True),
    ('cidr("10.0.0.0/16").containsIP(ip("10.1.0.1"))', False),
    ('ip(device.attributes["dra.net"].ipv4).family() == 4 && isIP("fe80::1") && !isIP("10.0.0.256")', True),
    ('ip("127.0.0.1").isLoopback() && cidr("10.0.1.7/24").masked() == cidr("10.0.1.0/24")', True),
    ('cidr("10.0.0.0/8").containsCIDR("10.1.0.0/16") && cidr("10.0.0.0/8").prefixLength() == 8', True),
    # cel.bind, macros
    ('cel.bind(n, device.attributes["dra.net"], n.rdma && n.mtu > 1500)', True),
    ('device.attributes["dra.net"].exists(k, k == "rdma")', True),
    ('["eth0", "eth1"].exists_one(n, n == device.attributes["dra.net"].ifName)', True),
    ("[1, 2, 3].map(x, x * 2).filter(y, y > 2) == [4, 6]", True),
    # heterogeneous equality and cross-type numeric comparison, as in Kubernetes
    ('device.attributes["dra.net"].mtu == 9000.0', True),
    ('device.attributes["dra.net"].mtu < 10000u', True),
    ('device.attributes["dra.net"].mtu == "9000"', False),
    ('device.attributes["dra.net"].rdma == 1', False),
    ("device.allowMultipleAllocations == false", True),
    (
        'type(device.attributes["dra.net"].mtu) == int && type(device.attributes["dra.net"].ifName) != int',
        True,
    ),
    (
        'device.attributes["dra.net"].mtu > 1 ? device.attributes["dra.net"].rdma : device.attributes["dra.net"].x',
        True,
    ),
    # an error on one side of || / && is absorbed when the other side decides
    ('device.attributes["dra.net"].sriov == true || device.attributes["dra.net"].rdma', True),
    ('device.attributes["dra.net"].ifName == "eth9" && device.attributes["dra.net"].sriov', False),
    ('[1, 2].exists(x, x == 2 || device.attributes["dra.net"].sriov)', True),
]


@pytest.mark.parametrize(("expression", "expected"), MATCHES)
def test_selector_result(expression: str, expected: bool) -> None:
    assert cel.compile_expression(expression).matches(VARS) is expected


RUNTIME_ERRORS = [
    # Kubernetes: "Any reference to an unknown field will cause an evaluation error and allocation to abort."
    ('device.attributes["dra.net"].sriov == true', "no such key: sriov"),
    ('device.attributes["other.example.com"].model == "x"', "no such key: model"),
    ('[1, 2].exists(x, x == device.attributes["dra.net"].sriov)', "no such key: sriov"),
    ('device.attributes["dra.net"].mtu / 0 == 1', "divide by zero"),
    ('semver("1.2") == semver("1.2.0")', "no Major.Minor.Patch"),
    ('quantity("1MB").isInteger()', "quantities must match"),
    ('"abc".charAt(5) == ""', "index out of range: 5"),
    (
        'device.attributes["dra.net"].ifName.matches(device.attributes["dra.net"].pciAddress + "(")',
        "regular expression",
    ),
    ('device.attributes["dra.net"].ifName.isGreaterThan(semver("1.0.0"))', "no such overload"),
    # an erroneous condition is the result of ?:, a non-bool one is an error
    ('device.attributes["dra.net"].sriov ? true : false', "no such key: sriov"),
    ("dyn(1) ? true : false", "no matching overload for _?_:_ applied to '(int, bool, bool)'"),
    # a dyn value that turns out not to be a bool
    ('dyn(device.attributes["dra.net"].mtu)', "could not be converted to bool"),
]


@pytest.mark.parametrize(("expression", "message"), RUNTIME_ERRORS)
def test_runtime_error_names_the_cause(expression: str, message: str) -> None:
    program = cel.compile_expression(expression)
    with pytest.raises(cel.CelEvalError, match=re.escape(message)):
        program.matches(VARS)


COMPILE_ERRORS = [
    # (expression, reason fragment, line, column)
    ('device.driver == "dra.net" &&', "syntax error: unexpected end of input", 1, None),
    ('device.attributes["dra.net"].ifName = "eth1"', "syntax error", 1, 37),
    (
        'device.attributes["dra.net"].ifName == "eth1"\n  && devices.driver == "x"',
        "undeclared reference to 'devices'",
        2,
        6,
    ),
    ('device.drivr == "dra.net"', "undefined field 'drivr'", 1, 8),
    ("device.driver == 1", "no matching overload for '_==_' applied to '(string, int)'", 1, 15),
    ('device.driver.lowerAscii(1) == "x"', "no matching overload for 'lowerAscii'", 1, 15),
    ("device.driver.noSuchFunction()", "undeclared reference to 'noSuchFunction'", 1, 15),
    ("device.driver", "must evaluate to bool, not string", None, None),
    ('[1, "a"] == []', "expected type 'int' but found 'string'", 1, 1),
    ('device.driver.matches("(")', "invalid regular expression", 1, 23),
    ('device.attributes["dra.net"].all(k, v, true)', "takes a variable and an expression", 1, None),
    ("[1].map(x, x > 0, x)", "three-argument map() macro is not supported", 1, None),
    ("9223372036854775808 > 0", "invalid int literal", 1, 1),
    ("sets.unknown([1], [2])", "undeclared reference to 'sets.unknown'", 1, 6),
    ("   ", "expression is empty", None, None),
]


@pytest.mark.parametrize(("expression", "reason", "line", "column"), COMPILE_ERRORS)
def test_compile_error_names_expression_and_position(
    expression: str, reason: str, line: int | None, column: int | None
) -> None:
    with pytest.raises(cel.CelCompileError) as caught:
        cel.compile_expression(expression)
    error = caught.value
    assert reason in error.reason
    assert error.expression == expression
    if line is not None:
        assert error.line == line
    if column is not None:
        assert error.column == column
    assert repr(expression[:40])[1:-1][:20] in str(error)


def test_expression_size_limit_is_10_kib_in_bytes() -> None:
    base = 'device.driver == "'
    at_limit = base + "x" * (cel.MAX_EXPRESSION_BYTES - len(base) - 1) + '"'
    assert len(at_limit.encode()) == cel.MAX_EXPRESSION_BYTES
    cel.compile_expression(at_limit)
    # a two-byte character pushes it over, though the length in characters is unchanged
    over = at_limit.replace("x", "é", 1)
    with pytest.raises(cel.CelCompileError, match="longer than the limit of 10240"):
        cel.compile_expression(over)


def test_cost_limit_stops_a_runaway_expression() -> None:
    expression = "[1,2,3,4,5,6,7,8,9,10].all(x, [1,2,3,4,5,6,7,8,9,10].all(y, [1,2,3,4,5].all(z, x*y*z > 0)))"
    assert cel.compile_expression(expression).matches(VARS) is True
    with pytest.raises(cel.CelEvalError, match="actual cost limit exceeded"):
        cel.compile_expression(expression, cost_limit=1000).matches(VARS)


def test_time_limit_stops_evaluation() -> None:
    expression = "[1,2,3,4,5,6,7,8,9,10].all(x, [1,2,3,4,5,6,7,8,9,10].all(y, [1,2,3,4,5].all(z, x*y*z > 0)))"
    with pytest.raises(cel.CelEvalError, match="time limit exceeded"):
        cel.compile_expression(expression).matches(VARS, timeout=0.0)


VARIABLE_ERRORS = [
    ({"attributes": {"fw": {"version": "1.02.0"}}}, "attribute fw: parse semantic version"),
    ({"attributes": {"x": {}}}, "attribute x: unsupported attribute value"),
    ({"capacity": {"bw": {"value": "fast"}}}, "capacity bw"),
]


@pytest.mark.parametrize(("device", "message"), VARIABLE_ERRORS)
def test_device_that_cannot_be_converted_is_a_runtime_error(device: dict[str, Any], message: str) -> None:
    with pytest.raises(cel.CelEvalError, match=message):
        cel.dra_device_variables({"name": "d", **device}, DRIVER)


def test_list_attributes_and_includes() -> None:
    device = {
        "name": "d",
        "attributes": {"numaNodes": {"ints": [0, 1]}, "fw": {"versions": ["1.0.0", "2.0.0"]}},
    }
    variables = cel.dra_device_variables(device, DRIVER)
    assert cel.compile_expression('device.attributes["dra.net"].numaNodes.includes(1)').matches(variables)
    assert cel.compile_expression(
        'device.attributes["dra.net"].fw.exists(v, v.isGreaterThan(semver("1.5.0")))'
    ).matches(variables)


def test_compiled_expression_is_safe_across_threads() -> None:
    program = cel.compile_expression('device.attributes["dra.net"].ifName == "eth1"')
    other = cel.dra_device_variables({**ETH1, "attributes": {"dra.net/ifName": {"string": "eth2"}}}, DRIVER)
    failures: list[str] = []

    def worker(variables: dict[str, Any], expected: bool) -> None:
        for _ in range(200):
            if program.matches(variables) is not expected:
                failures.append("mismatch")

    threads = [threading.Thread(target=worker, args=(v, e)) for v, e in ((VARS, True), (other, False)) * 2]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []


def test_cached_expression_compiles_once() -> None:
    expression = 'device.driver == "cache.example.com"'
    assert cel.cached_expression(expression) is cel.cached_expression(expression)
