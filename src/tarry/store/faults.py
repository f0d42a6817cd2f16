"""Which write failures are the disk's (full, read-only, failing), as ``StorageFault``: the log
store's ``OSError`` and SQLite's error codes alike, so every store opens the store breaker at
once for them (``tarry.dispatch.breaker``) and names the cause in ``/healthz``."""

from __future__ import annotations

import errno
import sqlite3

from tarry.errors import StorageFault

__all__ = ["storage_fault"]

_ERRNO_CAUSES = {
    errno.ENOSPC: "disk full",
    errno.EDQUOT: "disk quota exceeded",
    errno.EIO: "I/O error",
    errno.EROFS: "read-only file system",
}
# SQLite's primary result codes (the low byte of an extended code).
_SQLITE_CAUSES = {13: "disk full", 10: "I/O error", 8: "read-only database"}


def storage_fault(exc: BaseException, *, what: str) -> StorageFault | None:
    """``exc`` as a ``StorageFault`` saying that ``what`` cannot write (None when it is not a
    disk fault: a bug, a constraint, a closed database)."""
    cause: str | None = None
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", None)
        cause = _SQLITE_CAUSES.get(code & 0xFF) if isinstance(code, int) else None
    elif isinstance(exc, OSError):
        cause = _ERRNO_CAUSES.get(exc.errno or 0, "write failed")
    if cause is None:
        return None
    return StorageFault(
        f"{cause}: {what} cannot write ({exc}); nothing was stored, retry later", cause=cause
    )
