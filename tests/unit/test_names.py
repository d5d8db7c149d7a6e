"""Device names from interface names and PCI addresses (dranet pkg/names)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.names import (
    NameSource,
    assign_device_names,
    decode_interface_name,
    encode_interface_name,
    is_dns1123_label,
    normalize_interface_name,
    normalize_pci_address,
)


@pytest.mark.parametrize(
    ("ifname", "expected"),
    [
        # dranet's own table (names_test.go)
        ("eth0", "eth0"),
        ("my-device-1", "my-device-1"),
        ("eth:0", "net-mv2gqorq"),
        ("ETH0", "net-ivkeqma"),
        ("eth_int", "net-mv2gqx3jnz2a"),
        ("", ""),
        ("a" * 63, "a" * 63),
        (
            "very_long_interface_name_that_is_not_dns_compliant_at_all_and_exceeds_limits",
            "net-ozsxe6k7nrxw4z27nfxhizlsmzqwgzk7nzqw2zk7orugc5c7nfzv63tporpwi3ttl5rw63lqnruwc3tul5qxix3bnrwf6ylomrpwk6ddmvswi427nruw22luom",
        ),
        ("-eth", "net-fvsxi2a"),
        ("eth.0", "net-mv2gqlrq"),
    ],
)
def test_normalize_interface_name(ifname: str, expected: str) -> None:
    assert normalize_interface_name(ifname) == expected


def test_normalize_pci_address() -> None:
    assert normalize_pci_address("0000:8a:00.0") == "pci-0000-8a-00-0"
    assert normalize_pci_address("0000:AF:00.1") == "pci-0000-af-00-1"


@given(st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=15))
def test_encoded_names_are_labels_and_reversible(ifname: str) -> None:
    name = normalize_interface_name(ifname)
    assert is_dns1123_label(name)
    if name != ifname:
        assert decode_interface_name(name) == ifname


def test_collisions_are_settled_and_stable() -> None:
    # "net-mv2gqx3jnz2a" is both a literal label and the encoding of "eth_int".
    sources = [
        NameSource(ifname="net-mv2gqx3jnz2a"),
        NameSource(ifname="eth_int"),
        NameSource(pci_address="0000:01:00.0"),
    ]
    names = assign_device_names(sources)
    assert names["if:eth_int"] == "net-mv2gqx3jnz2a"
    assert names["if:net-mv2gqx3jnz2a"] == encode_interface_name("net-mv2gqx3jnz2a")
    assert names["pci:0000:01:00.0"] == "pci-0000-01-00-0"
    assert len(set(names.values())) == 3
    # The same devices in another order get the same names.
    assert assign_device_names(list(reversed(sources))) == names
    # Without the clash, the literal name is kept.
    assert assign_device_names([NameSource(ifname="net-mv2gqx3jnz2a")]) == {
        "if:net-mv2gqx3jnz2a": "net-mv2gqx3jnz2a"
    }
