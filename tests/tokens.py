"""Token blocks for the tests' ``tarry.toml``: a tenant's token owns ``NAME.*``."""

from __future__ import annotations


def tenant_token(tenant: str) -> str:
    """``[[auth.tokens]]`` for tenant ``tenant``: send, receive and admin on ``TENANT.*``, with
    the secret ``TENANT-secret``."""
    return f"""
[[auth.tokens]]
token = "{tenant}-secret"
name = "{tenant}"
send = ["{tenant}.*"]
receive = ["{tenant}.*"]
admin = ["{tenant}.*"]
"""


def root_token(*scopes: str) -> str:
    """``[[auth.tokens]]`` named ``root`` (secret ``root-secret``) with ``"*"`` in each of
    ``scopes`` (default: send, receive and admin)."""
    lines = [f'{scope} = ["*"]' for scope in scopes or ("send", "receive", "admin")]
    return '\n[[auth.tokens]]\ntoken = "root-secret"\nname = "root"\n' + "\n".join(lines) + "\n"
