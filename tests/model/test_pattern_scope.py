"""A policy pattern's proven literal prefix (finding 2): every name the pattern matches starts with
it, and the shapes that could reach further have none."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tarry.model.pattern_scope import literal_prefix


@pytest.mark.parametrize(
    ("pattern", "prefix"),
    [
        (r"^billing\.", "billing."),
        (r"\Abilling\.x", "billing.x"),
        (r"^billing\.(eu|us)$", "billing."),
        (r"^billing\.a|^billing\.b", "billing."),  # Python factors the common prefix out
        (r"^billinga*", "billing"),
        (r"^[b]illing", "billing"),
        (r"^(billing)", ""),
        (r"^", ""),
        (r".*", None),
        (r"billing\.", None),
        (r"^a|b", None),
        (r"(?i)^billing", None),
        (r"(?m)^billing", None),
        (r"(", None),
    ],
)
def test_finding_02_literal_prefix_of_pattern_shapes(pattern: str, prefix: str | None) -> None:
    assert literal_prefix(pattern) == prefix


PIECES = ["^", "\\A", "a", "b", ".", "\\.", "|", "(", ")", "*", "+", "?", "[ab]", "(?i)", "(?m)"]


@settings(max_examples=400, deadline=None)
@given(
    pieces=st.lists(st.sampled_from(PIECES), min_size=1, max_size=8),
    names=st.lists(st.text(alphabet="abAB.\n", max_size=6), min_size=1, max_size=20),
)
def test_finding_02_every_matched_name_starts_with_the_prefix(
    pieces: list[str], names: list[str]
) -> None:
    pattern = "".join(pieces)
    try:
        regex = re.compile(pattern)
    except re.error:
        assert literal_prefix(pattern) is None
        return
    prefix = literal_prefix(pattern)
    if prefix is None:
        return
    for name in names:
        if regex.search(name) or regex.fullmatch(name):
            assert name.startswith(prefix), (pattern, name)
