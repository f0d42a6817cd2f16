"""What every configuration section shares: strict sections, how a validation error reads, and
how a URL is shown without its credentials."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, ValidationError

__all__ = ["Section", "problems", "redact_url"]


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


def redact_url(url: str) -> str:
    """``scheme://user:secret@host`` → ``scheme://***@host`` (for logs and error messages)."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url


def problems(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or 'body'}: "
        f"{err['msg'].removeprefix('Value error, ')}"
        for err in exc.errors()
    )
