"""The budget charts as inline SVG text. Pure, no JavaScript library, nothing from a CDN.

The API server of a cluster deployment often has no internet access (and the UI must work on
the air-gapped machines next to the cluster), so the charts are drawn here from the numbers
the page also shows as text.
"""

from __future__ import annotations

from html import escape

from hpc_view.records import ProfileBudget

WIDTH = 640
BAR_HEIGHT = 20
PALETTE = ("#4878d0", "#ee854a", "#6acc64", "#d65f5f", "#956cb4", "#8c613c", "#dc7ec0", "#797979")


def figure(value: float | None, *, precise: bool = False) -> str:
    """GPU-hours as the page prints them: 4 decimals under 10 (or when ``precise``, so that what is
    left of a large allocation still shows a small job), else 1 decimal."""
    if value is None:
        return "n/a"
    return f"{value:,.4f}" if precise or abs(value) < 10 else f"{value:,.1f}"


def burndown_svg(budget: ProfileBudget) -> str:
    """What is left of the allocation after each completed job (a step line), or the cumulative use
    when the profile has no allocation."""
    height, left_pad, right_pad, top, bottom = 220, 70, 20, 28, 40
    plot_w, plot_h = WIDTH - left_pad - right_pad, height - top - bottom
    has_alloc = budget.allocation is not None
    values = [p.left if has_alloc else p.used for p in budget.burn]
    ceiling = budget.allocation if has_alloc else max(values or [0.0])
    ceiling = ceiling if ceiling and ceiling > 0 else 1.0
    where = " (Slurm limit)" if budget.source == "slurm" else ""
    title = (f"{budget.unit} left of {figure(budget.allocation)}{where}: "
             f"{figure(budget.left, precise=budget.total < 10)}"
             if has_alloc else f"{budget.unit} used: {figure(budget.total)} (no allocation tracked)")
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="burndown" width="{WIDTH}" height="{height}" '
             f'viewBox="0 0 {WIDTH} {height}" role="img" aria-label="{escape(title)}">',
             f'<text x="{left_pad}" y="18" class="chart-title">{escape(title)}</text>']
    y = lambda v: top + plot_h * (1 - max(min(v / ceiling, 1.0), 0.0))  # noqa: E731
    for frac in (0.0, 0.5, 1.0):
        gy = top + plot_h * (1 - frac)
        parts.append(f'<line x1="{left_pad}" y1="{gy:.1f}" x2="{WIDTH - right_pad}" y2="{gy:.1f}" '
                     'stroke="#ddd"/>')
        parts.append(f'<text x="{left_pad - 6}" y="{gy + 4:.1f}" text-anchor="end" class="axis">'
                     f'{escape(figure(ceiling * frac))}</text>')
    n = len(values)
    if n:
        xs = [left_pad + plot_w * (i + 1) / n for i in range(n)]
        start = budget.allocation if has_alloc else 0.0
        path = [f"M {left_pad} {y(start):.1f}"] + [f"H {x:.1f} V {y(v):.1f}" for x, v in zip(xs, values)]
        parts.append(f'<path d="{" ".join(path)}" fill="none" stroke="{PALETTE[0]}" stroke-width="2"/>')
        for x, v, point in zip(xs, values, budget.burn):
            parts.append(f'<circle cx="{x:.1f}" cy="{y(v):.1f}" r="3" fill="{PALETTE[0]}">'
                         f'<title>{escape(point.label)}: {escape(figure(v))}</title></circle>')
    else:
        parts.append(f'<text x="{left_pad + 10}" y="{top + plot_h / 2:.1f}" class="axis">'
                     'no completed job recorded yet</text>')
    parts.append(f'<text x="{left_pad}" y="{height - 12}" class="axis">completed jobs in time order '
                 f'({n})</text>')
    parts.append("</svg>")
    return "".join(parts)


def bars_svg(title: str, rows: list[tuple[str, float]], unit: str) -> str:
    """Horizontal bars, one per label (stage or run), scaled to the largest."""
    label_w, pad = 230, 10
    height = 30 + BAR_HEIGHT * max(len(rows), 1) + pad
    top = max((v for _, v in rows), default=0.0) or 1.0
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="bars" width="{WIDTH}" height="{height}" '
             f'viewBox="0 0 {WIDTH} {height}" role="img" aria-label="{escape(title)}">',
             f'<text x="{pad}" y="18" class="chart-title">{escape(title)} ({escape(unit)})</text>']
    for i, (label, value) in enumerate(rows):
        y = 28 + i * BAR_HEIGHT
        w = (WIDTH - label_w - 90) * value / top
        short = label if len(label) <= 34 else label[:15] + "..." + label[-16:]
        parts.append(f'<text x="{label_w - 6}" y="{y + 14}" text-anchor="end" class="axis">{escape(short)}'
                     f'<title>{escape(label)}</title></text>')
        parts.append(f'<rect x="{label_w}" y="{y + 3}" width="{max(w, 1):.1f}" height="{BAR_HEIGHT - 6}" '
                     f'fill="{PALETTE[i % len(PALETTE)]}"/>')
        parts.append(f'<text x="{label_w + max(w, 1) + 6:.1f}" y="{y + 14}" class="axis">'
                     f'{escape(figure(value))}</text>')
    if not rows:
        parts.append(f'<text x="{pad}" y="42" class="axis">nothing recorded yet</text>')
    parts.append("</svg>")
    return "".join(parts)


def budget_charts(budget: ProfileBudget) -> dict[str, str]:
    """The three charts of one profile: burn-down, per stage, per run."""
    return {
        "burndown": burndown_svg(budget),
        "by_stage": bars_svg("GPU-hours per stage", sorted(budget.by_stage.items()), budget.unit),
        "by_run": bars_svg("GPU-hours per DAG run", list(budget.by_run.items()), budget.unit),
    }
