"""Which queue names a policy pattern can reach, as far as can be proven: its literal prefix.

A token scoped to some names may set a policy only when every name the pattern could match is
one of its own. Deciding that for any regular expression is out of reach, so the proof accepts
one shape only: the pattern starts at the beginning of the name (``^`` or ``\\A``) and goes on
with plain characters, e.g. ``^billing\\.`` or ``^billing\\.(eu|us)``. Whatever follows cannot
undo the prefix: every name it matches starts with it, whether policies match by search with
the anchor or by full match. Anything else (no anchor, a top-level alternative, a class or group
before the prefix ends, a case-insensitive or multi-line flag) has no proven prefix.
"""

from __future__ import annotations

import re

# Python's own parser of the pattern (typeshed knows it only by its deprecated sre_* names).
import re._constants as sre_constants  # type: ignore[import-not-found]
import re._parser as sre_parser  # type: ignore[import-not-found]

__all__ = ["literal_prefix"]

_ANCHORS = frozenset({sre_constants.AT_BEGINNING, sre_constants.AT_BEGINNING_STRING})
#: Flags that let a literal or ``^`` match more than themselves.
_WIDENING = re.IGNORECASE | re.MULTILINE | re.LOCALE


def literal_prefix(pattern: str) -> str | None:
    """The text every name ``pattern`` matches starts with, or None when none can be proven
    (including a pattern that does not compile)."""
    try:
        parsed = sre_parser.parse(pattern)
    except (re.error, RecursionError, OverflowError):
        return None
    if parsed.state.flags & _WIDENING:
        return None
    items = list(parsed)
    if not items or items[0][0] is not sre_constants.AT or items[0][1] not in _ANCHORS:
        return None
    prefix: list[str] = []
    for op, value in items[1:]:
        if op is not sre_constants.LITERAL:
            break
        prefix.append(chr(value))
    return "".join(prefix)
