"""The refusal log: a flood of refusals is a handful of lines (issue 26, finding 7)."""

from __future__ import annotations

import logging

import pytest

from tarry.server.refusals import RefusalLog


def test_finding_07_refusals_are_logged_once_per_kind_then_counted_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    refusals = RefusalLog(logging.getLogger("tarry.test"), every_s=10, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="tarry.test"):
        for _ in range(10_000):
            refusals.note("connection_cap", "closed a connection")
        refusals.note("header_timeout", "closed a silent connection")
        assert len(caplog.records) == 2  # the first of each kind, at once
        now[0] += 10
        refusals.note("connection_cap", "closed a connection")
        assert len(caplog.records) == 3
        assert "(connection_cap; 10000 in the last 10s)" in caplog.records[-1].getMessage()
        now[0] += 5
        refusals.note("connection_cap", "closed a connection")
        assert len(caplog.records) == 3
