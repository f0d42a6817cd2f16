"""Small inline-SVG charts for the offline HTML report: no scripts, no fonts, no network.

Each function returns one ``<svg>`` element sized by its viewBox, so it scales with the page.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from html import escape

__all__ = ["bar_chart", "hbar_chart", "line_chart", "nice_max"]

WIDTH, HEIGHT = 900, 280
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 30, 40
COLOURS = ("#2563eb", "#d97706", "#dc2626", "#059669", "#7c3aed", "#64748b")

Point = tuple[float, float]


def nice_max(value: float) -> float:
    """The smallest 1, 2 or 5 × 10^k at or above ``value`` (a tidy top for the y axis)."""
    if value <= 0:
        return 1.0
    power = 1.0
    while power * 10 <= value:
        power *= 10
    while power > value:
        power /= 10
    for step in (1, 2, 5, 10):
        if step * power >= value:
            return step * power
    return 10 * power


def _frame(title: str, y_top: float, y_label: Callable[[float], str]) -> list[str]:
    parts = [
        f'<svg viewBox="0 0 {WIDTH} {HEIGHT}" role="img" xmlns="http://www.w3.org/2000/svg" '
        'font-family="sans-serif" font-size="11">',
        f"<title>{escape(title)}</title>",
        f'<text x="{LEFT}" y="16" font-size="13" font-weight="bold">{escape(title)}</text>',
    ]
    plot_h = HEIGHT - TOP - BOTTOM
    for i in range(5):
        y = TOP + plot_h - plot_h * i / 4
        parts.append(
            f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e5e7eb"/>'
        )
        parts.append(
            f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" fill="#374151">'
            f"{escape(y_label(y_top * i / 4))}</text>"
        )
    return parts


def _x_labels(
    xs: Sequence[float], x_of: Callable[[float], float], label: Callable[[float], str]
) -> list[str]:
    if not xs:
        return []
    count = min(6, len(xs))
    picks = sorted({xs[round(i * (len(xs) - 1) / max(1, count - 1))] for i in range(count)})
    anchors = {picks[0]: "start", picks[-1]: "end"} if len(picks) > 1 else {}
    return [
        f'<text x="{x_of(x):.1f}" y="{HEIGHT - BOTTOM + 16}" '
        f'text-anchor="{anchors.get(x, "middle")}" fill="#374151">{escape(label(x))}</text>'
        for x in picks
    ]


def _empty(parts: list[str], text: str) -> str:
    parts.append(
        f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle" fill="#6b7280">'
        f"{escape(text)}</text></svg>"
    )
    return "".join(parts)


def line_chart(
    title: str,
    series: Mapping[str, Sequence[Point]],
    *,
    x_label: Callable[[float], str],
    y_label: Callable[[float], str] = lambda v: f"{v:,.0f}",
) -> str:
    """One polyline per series over a shared x range, with a legend."""
    xs = sorted({x for points in series.values() for x, _ in points})
    ys = [y for points in series.values() for _, y in points]
    y_top = nice_max(max(ys, default=0.0))
    parts = _frame(title, y_top, y_label)
    if not xs:
        return _empty(parts, "no data")
    lo, hi = xs[0], xs[-1] if xs[-1] > xs[0] else xs[0] + 1
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x_of(x: float) -> float:
        return LEFT + plot_w * (x - lo) / (hi - lo)

    def y_of(y: float) -> float:
        return TOP + plot_h - plot_h * y / y_top

    for index, (name, points) in enumerate(series.items()):
        colour = COLOURS[index % len(COLOURS)]
        coords = " ".join(f"{x_of(x):.1f},{y_of(y):.1f}" for x, y in sorted(points))
        parts.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="1.8" points="{coords}"/>'
        )
        if len(points) == 1:
            ((x, y),) = points
            parts.append(f'<circle cx="{x_of(x):.1f}" cy="{y_of(y):.1f}" r="3" fill="{colour}"/>')
        lx = LEFT + 10 + index * 110
        parts.append(f'<rect x="{lx}" y="{TOP - 4}" width="10" height="10" fill="{colour}"/>')
        parts.append(f'<text x="{lx + 14}" y="{TOP + 5}">{escape(name)}</text>')
    parts += _x_labels(xs, x_of, x_label)
    parts.append("</svg>")
    return "".join(parts)


def bar_chart(
    title: str,
    points: Sequence[Point],
    *,
    x_step: float,
    x_from: float,
    x_to: float,
    x_label: Callable[[float], str],
    colour: str = COLOURS[0],
) -> str:
    """Vertical bars, one per ``x_step`` from ``x_from`` to ``x_to`` (gaps are zero)."""
    y_top = nice_max(max((y for _, y in points), default=0.0))
    parts = _frame(title, y_top, lambda v: f"{v:,.0f}")
    slots = max(1, round((x_to - x_from) / x_step))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    width = plot_w / slots

    def x_of(x: float) -> float:
        return LEFT + plot_w * (x - x_from) / (x_to - x_from)

    if not points:
        parts += _x_labels([x_from, x_to], x_of, x_label)
        return _empty(parts, "nothing falls due in this window")
    for x, y in points:
        h = plot_h * y / y_top
        parts.append(
            f'<rect x="{x_of(x):.2f}" y="{TOP + plot_h - h:.2f}" width="{max(width, 0.6):.2f}" '
            f'height="{h:.2f}" fill="{colour}"><title>{escape(x_label(x))}: {y:,.0f}</title></rect>'
        )
    parts += _x_labels([x_from + i * (x_to - x_from) / 5 for i in range(6)], x_of, x_label)
    parts.append("</svg>")
    return "".join(parts)


def hbar_chart(title: str, items: Sequence[tuple[str, float]]) -> str:
    """Horizontal bars with their values: the outcome mix."""
    row_h = 22
    height = TOP + row_h * max(1, len(items)) + 10
    top = max((v for _, v in items), default=0.0) or 1.0
    total = sum(v for _, v in items) or 1.0
    parts = [
        f'<svg viewBox="0 0 {WIDTH} {height}" role="img" xmlns="http://www.w3.org/2000/svg" '
        'font-family="sans-serif" font-size="11">',
        f"<title>{escape(title)}</title>",
        f'<text x="10" y="16" font-size="13" font-weight="bold">{escape(title)}</text>',
    ]
    bar_left, bar_w = 130, WIDTH - 130 - 170
    for i, (name, value) in enumerate(items):
        y = TOP + i * row_h
        w = bar_w * value / top
        parts.append(
            f'<text x="{bar_left - 8}" y="{y + 14}" text-anchor="end">{escape(name)}</text>'
        )
        parts.append(
            f'<rect x="{bar_left}" y="{y + 3}" width="{w:.1f}" height="15" '
            f'fill="{COLOURS[i % len(COLOURS)]}"/>'
        )
        parts.append(
            f'<text x="{bar_left + w + 6:.1f}" y="{y + 14}">{value:,.0f} '
            f"({100 * value / total:.1f} %)</text>"
        )
    parts.append("</svg>")
    return "".join(parts)
