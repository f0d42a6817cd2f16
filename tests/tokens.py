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
