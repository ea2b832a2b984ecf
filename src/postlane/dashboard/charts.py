"""Small inline SVG charts, rendered on the server: no chart library, no script."""

from __future__ import annotations

from collections.abc import Sequence

from markupsafe import Markup, escape


def human_seconds(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def per_second(rate: float) -> str:
    """A rate as the throughput page shows it: two decimals, and "< 0.01/s" for a trickle
    (a rate per second of a few messages a day would read 1.16e-05)."""
    if rate <= 0:
        return "0/s"
    return "< 0.01/s" if rate < 0.01 else f"{rate:,.2f}/s"


def human_span(seconds: float) -> str:
    if seconds >= 3600 and seconds % 3600 == 0:
        return "hour" if seconds == 3600 else f"{seconds / 3600:.0f} h"
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"


def sparkline(points: Sequence[tuple[float, float]], *, now: float, window_s: float = 3600.0,
              width: int = 260, height: int = 44, label: str = "",
              unit: str = "") -> Markup:
    """A line over the last ``window_s`` seconds (x: time, y: 0..max), with the max marked.

    ``points`` are ``(unix time, value)``, oldest first. An empty series draws a flat axis.
    """
    pad_top, pad_bottom = 12, 2
    inner = height - pad_top - pad_bottom
    visible = [(t, v) for t, v in points if t >= now - window_s]
    if visible:  # a server up for less than the window shows what it has, and says so
        window_s = min(window_s, max(60.0, now - visible[0][0]))
    start = now - window_s
    peak = max((v for _, v in visible), default=0.0)
    scale = peak if peak > 0 else 1.0

    def xy(t: float, v: float) -> str:
        x = (t - start) / window_s * width
        y = pad_top + inner - (v / scale) * inner
        return f"{x:.1f},{y:.1f}"

    if unit == "s":
        peak_text = human_seconds(peak)
    elif unit == "/s":
        peak_text = per_second(peak)
    else:
        peak_text = f"{peak:,.0f}"
    span = human_span(window_s)
    title = f"{label}: last {span}, max {peak_text}"
    parts = [
        f'<svg class="spark" role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">',
        f"<title>{escape(title)}</title>",
        f'<line class="axis" x1="0" y1="{height - pad_bottom}" x2="{width}" '
        f'y2="{height - pad_bottom}"/>',
        f'<text class="peak" x="2" y="9">max {escape(peak_text)}</text>',
        f'<text class="span" x="{width - 2}" y="9" text-anchor="end">'
        f"last {escape(span)}</text>",
    ]
    if len(visible) == 1:
        t, v = visible[0]
        x, y = xy(t, v).split(",")
        parts.append(f'<circle class="line" cx="{x}" cy="{y}" r="2"/>')
    elif visible:
        line = " ".join(xy(t, v) for t, v in visible)
        area = f"{xy(visible[0][0], 0)} {line} {xy(visible[-1][0], 0)}"
        parts.append(f'<polygon class="area" points="{area}"/>')
        parts.append(f'<polyline class="line" points="{line}"/>')
    parts.append("</svg>")
    return Markup("".join(parts))


def bars(values: Sequence[tuple[str, int]], *, width: int = 260, bar_height: int = 14,
         label: str = "") -> Markup:
    """Horizontal bars, one per ``(name, count)``, scaled to the largest."""
    peak = max((v for _, v in values), default=0) or 1
    gap = 4
    label_w = 44
    height = max(1, len(values)) * (bar_height + gap)
    parts = [f'<svg class="bars" role="img" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">',
             f"<title>{escape(label)}</title>"]
    for i, (name, count) in enumerate(values):
        y = i * (bar_height + gap)
        w = (width - label_w - 60) * count / peak
        parts.append(f'<text x="0" y="{y + bar_height - 3}">{escape(name)}</text>')
        parts.append(f'<rect class="bar" x="{label_w}" y="{y}" width="{w:.1f}" '
                     f'height="{bar_height}"/>')
        parts.append(f'<text x="{label_w + w + 4:.1f}" y="{y + bar_height - 3}">'
                     f"{count:,}</text>")
    parts.append("</svg>")
    return Markup("".join(parts))
