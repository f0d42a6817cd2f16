"""The route guard's rules (``tarry.model.egress``): which addresses a route put through the API
may reach, and how the operator's ``[egress]`` opens exceptions."""

from __future__ import annotations

import ipaddress

import pytest

from tarry.config import EgressConfig, load_config
from tarry.errors import ForbiddenAddress, InvalidArgument, NotAuthorized
from tarry.model.egress import ALLOW_ALL, EgressPolicy, parse_allow_entry

GUARD = EgressPolicy()


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("127.0.0.1", "loopback"),
        ("127.8.9.10", "loopback"),
        ("::1", "loopback"),
        ("169.254.169.254", "link-local"),  # AWS, GCP, Azure metadata
        ("fe80::1", "link-local"),
        ("fd00:ec2::254", "private"),  # AWS metadata over IPv6
        ("100.100.100.200", "not globally routable"),  # Alibaba metadata (shared space)
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("192.168.1.1", "private"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("240.0.0.1", "reserved"),
        ("::ffff:127.0.0.1", "loopback"),  # IPv4-mapped
        ("64:ff9b::a9fe:a9fe", "link-local"),  # NAT64 of 169.254.169.254
        ("2002:7f00:1::", "loopback"),  # 6to4 of 127.0.0.1
    ],
)
def test_an_address_that_is_not_globally_routable_is_refused_saying_why(address, kind) -> None:
    with pytest.raises(ForbiddenAddress, match=kind) as refused:
        GUARD.check_address(address, ipaddress.ip_address(address))
    # The refusal says what to configure, carries the stable code, and is a NotAuthorized
    assert "[egress] allow" in refused.value.message
    assert refused.value.code == "forbidden_address" and refused.value.http_status == 403
    assert isinstance(refused.value, NotAuthorized)
    assert refused.value.details == {"address": str(ipaddress.ip_address(address))}


@pytest.mark.parametrize("address", ["93.184.215.14", "8.8.8.8", "2606:4700:4700::1111"])
def test_a_public_address_is_allowed(address) -> None:
    GUARD.check_address("hooks.example.com", ipaddress.ip_address(address))


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/x",
        "http://[::1]/x",
        "https://169.254.169.254/latest/meta-data/",
        "http://10.0.0.1/",
        "http://127.1/",  # the short forms a resolver accepts
        "http://2130706433/",
        "http://0x7f000001/",
        "http://localhost:9/",
        "http://LOCALHOST./",
        "http://api.localhost/",
        "http://metadata.google.internal/computeMetadata/v1/",
        "http://user:pw@[::ffff:10.0.0.1]:80/",
    ],
)
def test_a_url_known_to_be_internal_is_refused_before_any_lookup(url) -> None:
    with pytest.raises(ForbiddenAddress):
        GUARD.check_url(url)


@pytest.mark.parametrize("url", ["https://hooks.example.com/x", "http://93.184.215.14/"])
def test_a_public_url_or_a_name_passes_until_it_is_resolved(url) -> None:
    GUARD.check_url(url)


def test_the_operators_allow_list_opens_hosts_addresses_and_networks() -> None:
    policy = EgressPolicy.from_entries(["hooks.internal", "10.1.2.0/24", "127.0.0.1", "::1"])
    policy.check_url("http://127.0.0.1:9/x")
    policy.check_url("http://[::1]/x")
    policy.check_address("10.1.2.3", ipaddress.ip_address("10.1.2.3"))
    # A named host is allowed whatever it resolves to; only it
    policy.check_address("HOOKS.internal.", ipaddress.ip_address("10.9.9.9"))
    with pytest.raises(ForbiddenAddress, match=r"other.internal \(10.9.9.9\) is a private"):
        policy.check_address("other.internal", ipaddress.ip_address("10.9.9.9"))
    with pytest.raises(ForbiddenAddress):
        policy.check_url("http://10.1.3.1/")
    with pytest.raises(ForbiddenAddress, match="local name"):
        policy.check_url("http://localhost/")
    # Everything passes without the guard
    ALLOW_ALL.check_url("http://localhost/")
    ALLOW_ALL.check_address("x", ipaddress.ip_address("169.254.169.254"))


@pytest.mark.parametrize("entry", ["", "10.0.0.0/33", "a..b", "bad host", "http://x/"])
def test_an_allow_entry_that_is_neither_an_address_nor_a_name_is_refused(entry) -> None:
    with pytest.raises(InvalidArgument, match="neither an address"):
        parse_allow_entry(entry)
    with pytest.raises(InvalidArgument, match=r"egress\.allow"):
        load_config(overrides={"egress": {"allow": [entry]}})


def test_auto_guards_a_server_with_tokens_and_leaves_a_tokenless_one_open() -> None:
    assert EgressConfig().policy(authenticated=False).allow_all
    assert not EgressConfig().policy(authenticated=True).allow_all
    assert not EgressConfig(internal="refuse").policy(authenticated=False).allow_all
    assert EgressConfig(internal="allow").policy(authenticated=True).allow_all
    tokens = {"tokens": [{"token": "t", "send": ["*"]}]}
    assert not load_config(overrides={"auth": tokens}).egress_policy.allow_all
    assert load_config().egress_policy.allow_all
