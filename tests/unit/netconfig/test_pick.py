"""Seed step 1: pick one opaque config (dranet dra_hooks.go:241)."""

from __future__ import annotations

from typing import Any

import pytest

from shared.netconfig import ConfigError
from shared.netconfig.pick import pick_config, request_matches


def entry(
    source: str, params: Any, requests: list[str] | None = None, driver: str = "dra.net"
) -> dict[str, Any]:
    e: dict[str, Any] = {"source": source, "opaque": {"driver": driver, "parameters": params}}
    if requests is not None:
        e["requests"] = requests
    return e


CLASS = entry("FromClass", {"interface": {"mtu": 9000}})
CLAIM = entry("FromClaim", {"interface": {"mtu": 1500}})
BAD = entry("FromClass", {"interface": {"mtu": "big"}})

CASES: list[tuple[str, list[dict[str, Any]], str, int | None, int | None, bool]] = [
    # (name, entries, request, picked index, mtu, errors)
    ("no entries: empty config", [], "nic", None, None, False),
    ("class only", [CLASS], "nic", 0, 9000, False),
    ("claim only", [CLAIM], "nic", 0, 1500, False),
    ("both: class first wins", [CLASS, CLAIM], "nic", 0, 9000, False),
    ("both, claim listed first: class still first", [CLAIM, CLASS], "nic", 1, 9000, False),
    (
        "other driver skipped",
        [entry("FromClass", {"interface": {"mtu": 1}}, driver="gpu.example.com"), CLAIM],
        "nic",
        1,
        1500,
        False,
    ),
    (
        "other request skipped",
        [entry("FromClass", {"interface": {"mtu": 9000}}, ["gpu"]), CLAIM],
        "nic",
        1,
        1500,
        False,
    ),
    (
        "named request matches",
        [entry("FromClaim", {"interface": {"mtu": 4000}}, ["nic"])],
        "nic",
        0,
        4000,
        False,
    ),
    (
        "subrequest matches its parent",
        [entry("FromClaim", {"interface": {"mtu": 4000}}, ["nic"])],
        "nic/fast",
        0,
        4000,
        False,
    ),
    ("absent parameters skipped", [entry("FromClass", None), CLAIM], "nic", 1, 1500, False),
    ("empty-object parameters are a config and win", [entry("FromClass", {}), CLAIM], "nic", 0, None, False),
    ("invalid earlier entry fails the claim", [BAD, CLAIM], "nic", 1, 1500, True),
    (
        "later entries are not read",
        [CLASS, entry("FromClaim", {"interface": {"mtu": "bad"}})],
        "nic",
        0,
        9000,
        False,
    ),
    (
        "invalid entry for another request is not read",
        [entry("FromClass", {"bogus": 1}, ["gpu"]), CLAIM],
        "nic",
        1,
        1500,
        False,
    ),
]


@pytest.mark.parametrize(
    ("name", "entries", "req", "index", "mtu", "has_errors"), CASES, ids=[c[0] for c in CASES]
)
def test_pick(
    name: str,
    entries: list[dict[str, Any]],
    req: str,
    index: int | None,
    mtu: int | None,
    has_errors: bool,
) -> None:
    picked = pick_config(entries, req)
    assert picked.index == index
    assert picked.config.interface.mtu == mtu
    assert bool(picked.errors) == has_errors


def test_errors_name_the_entry_and_field() -> None:
    picked = pick_config([BAD, CLAIM], "nic")
    assert [str(e) for e in picked.errors] == [
        'config[0] (FromClass) interface.mtu: expected an integer, got string "big"'
    ]
    with pytest.raises(ConfigError) as err:
        picked.raise_for_errors("claim default/db-0 request nic")
    assert str(err.value).startswith("claim default/db-0 request nic: config[0] (FromClass) interface.mtu")


def test_validation_errors_count_too() -> None:
    picked = pick_config([entry("FromClaim", {"interface": {"mtu": 10}})], "nic")
    assert picked.index is None
    assert "interface.mtu: must be between 68 and 65535, got 10" in str(picked.errors[0])


@pytest.mark.parametrize(
    ("requests", "req", "ok"),
    [
        ([], "a", True),
        (["a"], "a", True),
        (["b"], "a", False),
        (["a"], "a/x", True),
        (["a/x"], "a/x", True),
        (["a/y"], "a/x", False),
    ],
)
def test_request_matches(requests: list[str], req: str, ok: bool) -> None:
    assert request_matches(requests, req) is ok
