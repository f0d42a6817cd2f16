"""The report as one self-contained HTML file: inline CSS and inline SVG charts, no scripts and
nothing fetched, so it opens offline in any browser (and prints)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from html import escape
from typing import Any

from tarry.pipeline.svg import bar_chart, hbar_chart, line_chart

__all__ = ["render_report"]

HOUR_MS, MINUTE_MS = 3_600_000, 60_000
_CSS = """
body{font-family:sans-serif;margin:24px auto;max-width:960px;color:#111827}
h1{font-size:22px}h2{font-size:16px;margin-top:28px}
table{border-collapse:collapse;font-size:12px;width:100%}
th,td{border-bottom:1px solid #e5e7eb;padding:3px 6px;text-align:right}
th:first-child,td:first-child{text-align:left}
.cards{display:flex;gap:12px;flex-wrap:wrap}
.card{border:1px solid #e5e7eb;border-radius:6px;padding:8px 14px}
.card b{display:block;font-size:18px}
svg{width:100%;height:auto}figure{margin:24px 0}
"""


def _when(ms: float, fmt: str) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime(fmt)


def _ms(value: float) -> str:
    if value >= 60_000:
        return f"{value / 60_000:.1f} min"
    if value >= 1_000:
        return f"{value / 1_000:.1f} s"
    return f"{value:.0f} ms"


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}"
    if isinstance(value, int):
        return f"{value:,}"
    return escape(str(value))


def _table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    head = "".join(f"<th>{escape(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{_cell(row.get(c))}</td>" for c in columns) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render_report(
    *,
    summary: Mapping[str, Any],
    outcomes: Sequence[Mapping[str, Any]],
    lateness: Sequence[Mapping[str, Any]],
    forecast_minute: Sequence[Mapping[str, Any]],
    forecast_hour: Sequence[Mapping[str, Any]],
    destinations: Sequence[Mapping[str, Any]],
) -> str:
    now = int(summary["now_ms"])
    cards = "".join(
        f'<div class="card">{escape(label)}<b>{_cell(summary.get(key))}</b></div>'
        for label, key in (
            ("events", "events"),
            ("destinations", "destinations"),
            ("hours", "hours"),
            ("pending", "pending"),
            ("overdue", "overdue"),
            ("journal files", "files"),
        )
    )
    late_series = {
        p: [(float(r["hour_ms"]), float(r[f"lateness_{p}_ms"] or 0)) for r in lateness]
        for p in ("p50", "p95", "p99")
    }
    late_series["max"] = [(float(r["hour_ms"]), float(r["lateness_max_ms"] or 0)) for r in lateness]
    charts = [
        line_chart(
            "Release lateness per hour (all destinations)",
            late_series,
            x_label=lambda x: _when(x, "%m-%d %H:00"),
            y_label=_ms,
        ),
        bar_chart(
            "Pending messages falling due per minute, next 24 h",
            [(float(r["minute_ms"]), float(r["due"])) for r in forecast_minute],
            x_step=MINUTE_MS,
            x_from=now - now % MINUTE_MS,
            x_to=now - now % MINUTE_MS + 24 * HOUR_MS,
            x_label=lambda x: _when(x, "%H:%M"),
        ),
        bar_chart(
            "Pending messages falling due per hour, next 30 days",
            [(float(r["hour_ms"]), float(r["due"])) for r in forecast_hour],
            x_step=HOUR_MS,
            x_from=now - now % HOUR_MS,
            x_to=now - now % HOUR_MS + 30 * 24 * HOUR_MS,
            x_label=lambda x: _when(x, "%m-%d"),
            colour="#7c3aed",
        ),
        hbar_chart("Outcome mix (events by kind)", [(r["event"], r["count"]) for r in outcomes]),
    ]
    columns = [
        "destination",
        "scheduled",
        "released",
        "delivered",
        "acked",
        "expired",
        "dead_lettered",
        "cancelled",
        "worst_hour_p99_ms",
        "lateness_max_ms",
    ]
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        "<title>tarry delivery report</title>"
        f"<style>{_CSS}</style></head><body>"
        "<h1>tarry delivery report</h1>"
        f"<p>Generated for {escape(_when(now, '%Y-%m-%d %H:%M:%S UTC'))} from "
        f"{_cell(summary.get('files'))} journal file(s). Tables: hourly/, lateness/, outcomes/, "
        "forecast_minute/, forecast_hour/ (Parquet) beside this file.</p>"
        f'<div class="cards">{cards}</div>'
        + "".join(f"<figure>{chart}</figure>" for chart in charts)
        + "<h2>Destinations (top 200 by messages scheduled)</h2>"
        + _table(destinations, columns)
        + "</body></html>"
    )
