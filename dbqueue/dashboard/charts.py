"""The throughput chart as inline SVG, drawn on the server: no script, no asset from outside."""

from __future__ import annotations

import datetime as dt
from html import escape

from markupsafe import Markup


def total(finished: dict[str, dict[str, list[int]]], buckets: int) -> dict[str, list[int]]:
    summed = {"succeeded": [0] * buckets, "dead": [0] * buckets}
    for series in finished.values():
        for name in summed:
            summed[name] = [a + b for a, b in zip(summed[name], series[name], strict=True)]
    return summed


def bars(
    series: dict[str, list[int]],
    start: dt.datetime,
    minutes: int,
    width: int = 240,
    height: int = 48,
) -> Markup:
    """Stacked bars, succeeded (green) under dead (red), one per bucket; each bar's title
    says its time and counts."""
    ok, dead = series["succeeded"], series["dead"]
    peak = max([a + b for a, b in zip(ok, dead, strict=True)] + [1])
    step = width / len(ok)
    parts = [
        f'<svg class="chart" role="img" width="{width}" height="{height + 14}" '
        f'viewBox="0 0 {width} {height + 14}"><title>jobs finished per {minutes} minutes, '
        f"last hour (peak {peak})</title>"
    ]
    for i, (n_ok, n_dead) in enumerate(zip(ok, dead, strict=True)):
        at = start + dt.timedelta(minutes=minutes * i)
        x = i * step + 1
        h_ok = n_ok / peak * height
        h_dead = n_dead / peak * height
        label = escape(f"{at:%H:%M} UTC: {n_ok} succeeded, {n_dead} dead")
        parts.append(
            f"<g><title>{label}</title>"
            f'<rect class="ok" x="{x:.1f}" y="{height - h_ok:.1f}" width="{step - 2:.1f}" '
            f'height="{h_ok:.1f}"/>'
            f'<rect class="dead" x="{x:.1f}" y="{height - h_ok - h_dead:.1f}" '
            f'width="{step - 2:.1f}" height="{h_dead:.1f}"/></g>'
        )
    parts.append(
        f'<text x="0" y="{height + 12}">{start:%H:%M}</text>'
        f'<text x="{width}" y="{height + 12}" text-anchor="end">now</text></svg>'
    )
    return Markup("".join(parts))
