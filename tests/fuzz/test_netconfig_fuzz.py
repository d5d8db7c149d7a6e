"""Opaque claim configs of any shape through the pure steps prepare runs on them
(shared/prepareplan.py, which services/prepare/pipeline.py calls): pick the dra.net entry (strict parse,
defaults, validation), merge it over a provider config, finalize, and store it as JSON
that attach parses back.

Property: the only exception is ConfigError; each of its errors names a field path
(a key of the input, or "" only when the input is not a JSON object at all); its text
is valid UTF-8 (it goes into a protobuf string for the kubelet and into the claim
status); a config that passes survives the JSON round trip unchanged. Each example has
a deadline, so a hang or a quadratic blow-up fails the test."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.netconfig import ConfigError, NetworkConfig, parse_network_config
from shared.netconfig.errors import key_text
from shared.netconfig.merge import merge
from shared.netconfig.pick import pick_config
from shared.netconfig.validate import finalize, load
from tests.unit.netconfig.test_validate import INVALID, VALID

FIELDS = {"profile", "interface", "routes", "rules", "neighbors", "ethtool"}
# The "where" prefix pick_config puts before each path.
WHERE = re.compile(r"^config\[\d+\] \([^)]*\) ?")
FUZZ = settings(
    max_examples=500,
    deadline=2000,  # ms per example: parsing must never hang or go quadratic
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# -- hostile values ----------------------------------------------------------------------------

HOSTILE_TEXT = [
    "",
    " ",
    "../../etc/passwd",
    "/etc/passwd",
    "a/b",
    ".",
    "..",
    "eth0\n",
    "eth\x000",
    "\ud800",  # a lone surrogate: JSON "\ud800" decodes to it
    "x\udfff",
    "é",
    "👍",
    "\u202e0hte",  # right-to-left override
    "٢٤",  # Arabic-Indic digits: str.isdigit() is true
    "²",  # superscript two: isdigit() true, int() refuses it
    "10.0.0.1/²",
    "10.0.0.1/٢٤",
    "fe80::1%eth0",
    "%d",
    "a" * 300,
    "a" * 100_000,
]
HOSTILE_INTS = [-1, 0, 2**31, -(2**31) - 1, 2**32, 2**63, -(2**63) - 1, 10**30, 10**4000]
# Values hypothesis cannot print (repr fails on them): used in the table test below.
UNPRINTABLE = [10**5000, -(10**5000)]
HOSTILE_FLOATS = [0.5, 1e308, float("inf"), float("-inf"), float("nan"), 1500.0, -0.0]


def deep(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


hostile_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from(HOSTILE_TEXT),
    st.sampled_from(HOSTILE_INTS),
    st.sampled_from(HOSTILE_FLOATS),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    # Every code point, lone surrogates included.
    st.text(st.characters(exclude_categories=()), max_size=40),
)
json_values = st.recursive(
    hostile_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.dictionaries(st.text(st.characters(exclude_categories=()), max_size=12), inner, max_size=5),
        st.dictionaries(st.sampled_from(sorted(FIELDS)), inner, max_size=4),
    ),
    max_leaves=30,
)
hostile_values = st.one_of(
    hostile_scalars,
    json_values,
    st.sampled_from([deep(50), deep(200), [], {}, [[[]]], {"": None}]),
)

# -- near-valid configs: one mutation of a known-valid one ------------------------------------

SEEDS: list[dict[str, Any]] = [v for v in VALID if v] + [
    raw for raw, _ in INVALID if all(k in FIELDS for k in raw)
]


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every location inside a JSON value (dict keys and list indexes)."""
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += paths(v, (*prefix, i))
    return out


def put(root: Any, where: tuple[Any, ...], value: Any) -> Any:
    if not where:
        return value
    node = root
    for step in where[:-1]:
        node = node[step]
    node[where[-1]] = value
    return root


def fresh(value: Any) -> Any:
    """A copy: later mutations must not change constants hypothesis hands out again."""
    return copy.deepcopy(value)


@st.composite
def near_valid(draw: st.DrawFn) -> Any:
    cfg = copy.deepcopy(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from(paths(cfg)))
        target = cfg
        for step in where:
            target = target[step]
        kind = draw(st.sampled_from(["replace", "unknown-key", "delete", "wrap", "null"]))
        if kind == "replace":
            cfg = put(cfg, where, fresh(draw(hostile_values)))
        elif kind == "unknown-key" and isinstance(target, dict):
            target[draw(st.sampled_from(["mtu ", "MTU", "Name", "", "\ud800", "a" * 300, "__proto__"]))] = (
                fresh(draw(hostile_values))
            )
        elif kind == "delete" and where:
            parent = cfg
            for step in where[:-1]:
                parent = parent[step]
            del parent[where[-1]]
        elif kind == "wrap":
            cfg = put(cfg, where, [target] if draw(st.booleans()) else {"value": target})
        elif kind == "null":
            cfg = put(cfg, where, None)
    return cfg


def as_text(value: Any) -> str | None:
    try:
        return json.dumps(value)  # ensure_ascii: lone surrogates become "\ud800" escapes
    except (ValueError, RecursionError):
        return None  # not representable as JSON text (e.g. nan is, 10**5000 is not)


@st.composite
def json_texts(draw: st.DrawFn) -> str | bytes:
    """JSON text as the API server or a stored record would carry it, and broken text."""
    value = draw(st.one_of(near_valid(), hostile_values))
    text = as_text(value) or "{}"
    kind = draw(st.sampled_from(["as-is", "truncated", "bytes", "deep", "bigint", "garbage"]))
    if kind == "truncated" and text:
        return text[: draw(st.integers(0, len(text) - 1))]
    if kind == "bytes":
        return text.encode() + draw(st.sampled_from([b"", b"\xff", b"\xc3", b"\xed\xa0\x80"]))
    if kind == "deep":
        n = draw(st.sampled_from([100, 2000, 200_000]))
        return '{"interface":' * n + "1" + "}" * n
    if kind == "bigint":
        return '{"interface": {"mtu": ' + "9" * draw(st.sampled_from([20, 4300, 5000, 50_000])) + "}}"
    if kind == "garbage":
        return draw(st.text(st.characters(exclude_categories=()), max_size=200))
    return text


# -- the pipeline's pure steps and the property ------------------------------------------------

PROVIDERS = [None] + [c for c in (parse_network_config(v) for v in VALID) if c is not None]


def prepare_pure(params: Any, provider: NetworkConfig | None) -> NetworkConfig:
    """shared/prepareplan.py's config steps without a device: pick, merge, finalize, store, read back."""
    entry = {"source": "FromClaim", "requests": [], "opaque": {"driver": "dra.net", "parameters": params}}
    picked = pick_config([entry], "nic")
    picked.raise_for_errors("request nic device eth1")
    final = finalize(merge(picked.config, provider))
    stored = final.to_json()
    assert parse_network_config(stored) == final, "what prepare stores must read back unchanged"
    return final


def top_keys(params: Any) -> set[str]:
    if isinstance(params, str | bytes):
        try:
            params = json.loads(params)
        except (ValueError, RecursionError):
            return set()
    return set(params) if isinstance(params, dict) else set()


def check_error(exc: ConfigError, params: Any) -> None:
    assert exc.errors, "a ConfigError must carry at least one FieldError"
    text = str(exc)
    text.encode("utf-8")  # a lone surrogate here breaks the kubelet's protobuf reply
    keys = top_keys(params)
    for fe in exc.errors:
        path = WHERE.sub("", fe.path)
        if not path:
            # Only a value that is no JSON object (or no JSON at all) has no field to name.
            assert not keys or not isinstance(params, dict), f"error without a field path: {fe}"
            assert re.match(r"(invalid JSON|expected an object|not valid)", fe.message), fe
            continue
        names = FIELDS | keys | {key_text(k) for k in keys}
        assert any(path == n or path.startswith((f"{n}.", f"{n}[")) for n in names), (
            f"error path {path!r} names no field of the input (keys {sorted(keys)[:5]})"
        )


def run(params: Any, provider: NetworkConfig | None = None) -> None:
    try:
        prepare_pure(params, provider)
    except ConfigError as exc:
        check_error(exc, params)


@FUZZ
@given(json_values)
def test_any_json_value_is_a_config_or_a_config_error(params: Any) -> None:
    run(params)


@FUZZ
@given(near_valid(), st.sampled_from(PROVIDERS))
def test_near_valid_configs_over_a_provider_config(params: Any, provider: NetworkConfig | None) -> None:
    run(params, provider)


@FUZZ
@given(json_texts())
def test_json_text_and_bytes(text: str | bytes) -> None:
    # Stored records (pod_config_json) and provider configs arrive as text.
    try:
        cfg = load(text)
    except ConfigError as exc:
        check_error(exc, text)
        return
    if cfg is not None:
        assert parse_network_config(cfg.to_json()) == cfg


@pytest.mark.parametrize("top", sorted(FIELDS))
@pytest.mark.parametrize(
    "value",
    [*HOSTILE_TEXT, *UNPRINTABLE, deep(3000), deep(100_000)],
    ids=lambda v: repr(v)[:20] if isinstance(v, str) else type(v).__name__,
)
def test_hostile_value_in_every_string_field(value: Any, top: str) -> None:
    shapes = {
        "profile": {"profile": value},
        "interface": {
            "interface": {"name": value, "addresses": [value], "hardwareAddr": value, "vrf": {"name": value}}
        },
        "routes": {"routes": [{"destination": value, "gateway": value, "source": value}]},
        "rules": {"rules": [{"source": value, "destination": value}]},
        "neighbors": {"neighbors": [{"destination": value, "hardwareAddr": value}]},
        "ethtool": {"ethtool": {"features": {value if isinstance(value, str) else "x": True}}},
    }
    run(shapes[top])
