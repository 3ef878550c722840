"""The budget charts and the stages' training curves as inline SVG text. Pure, no JavaScript
library, nothing from a CDN.

The API server of a cluster deployment often has no internet access (and the UI must work on
the air-gapped machines next to the cluster), so the charts are drawn here from the numbers
the page also shows as text.
"""

from __future__ import annotations

from html import escape

from vcloud.contract import TrainingCurve, thin_points

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
    ceiling = budget.allocation if has_alloc else max([v for v in values if v is not None] or [0.0])
    ceiling = ceiling if ceiling and ceiling > 0 else 1.0
    where = {"slurm": " (Slurm limit)", "command": " (site command)"}.get(budget.source, "")
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


CURVE_WIDTH, CURVE_HEIGHT = 320, 190
CURVE_PAD = (58, 14, 30, 38)
"""Left, right, top and bottom margins of a curve chart around its plot area."""


def tick(value: float) -> str:
    """An axis number: 4 significant digits, no exponent for the values a curve has (steps, dB, loss)."""
    return f"{value:.4g}" if abs(value) >= 1e-3 or value == 0 else f"{value:.2e}"


def _span(values: list[float]) -> tuple[float, float]:
    low, high = min(values), max(values)
    if high > low:
        return low, high
    pad = abs(low) * 0.05 or 1.0  # one value (or a flat curve): centred in a small range around it
    return low - pad, high + pad


def curve_svg(title: str, points: list[tuple[int, float]] | tuple[tuple[int, float], ...], *, y_label: str,
              colour: str = PALETTE[0], x_label: str = "step") -> str:
    """A small line chart of ``(step, value)`` points: one polyline scaled to the points' own ranges,
    the lowest and highest value on the y axis, the first and last step on the x axis, and the last
    point in the title. One point is drawn as a dot; none says so."""
    left, right, top, bottom = CURVE_PAD
    plot_w, plot_h = CURVE_WIDTH - left - right, CURVE_HEIGHT - top - bottom
    heading = f"{title}: {tick(points[-1][1])} at {x_label} {points[-1][0]}" if points else title
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="curve" width="{CURVE_WIDTH}" '
             f'height="{CURVE_HEIGHT}" viewBox="0 0 {CURVE_WIDTH} {CURVE_HEIGHT}" role="img" '
             f'aria-label="{escape(heading)}">',
             f'<text x="{left}" y="16" class="chart-title">{escape(heading)}</text>',
             f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#ddd"/>',
             f'<text x="{left + plot_w / 2:.1f}" y="{CURVE_HEIGHT - 6}" text-anchor="middle" class="axis">'
             f'{escape(x_label)}</text>',
             f'<text x="12" y="{top + plot_h / 2:.1f}" text-anchor="middle" class="axis" '
             f'transform="rotate(-90 12 {top + plot_h / 2:.1f})">{escape(y_label)}</text>']
    if not points:
        parts.append(f'<text x="{left + 10}" y="{top + plot_h / 2:.1f}" class="axis">no point yet</text>'
                     '</svg>')
        return "".join(parts)
    x_low, x_high = _span([float(s) for s, _ in points])
    y_low, y_high = _span([v for _, v in points])
    x = lambda s: left + plot_w * (s - x_low) / (x_high - x_low)  # noqa: E731
    y = lambda v: top + plot_h * (1 - (v - y_low) / (y_high - y_low))  # noqa: E731
    for value in (y_low, y_high):
        parts.append(f'<text x="{left - 4}" y="{y(value) + 4:.1f}" text-anchor="end" class="axis">'
                     f'{escape(tick(value))}</text>')
    for step, anchor in ((x_low, "start"), (x_high, "end")):
        parts.append(f'<text x="{x(step):.1f}" y="{top + plot_h + 14}" text-anchor="{anchor}" class="axis">'
                     f'{escape(tick(step))}</text>')
    coords = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in points)
    parts.append(f'<polyline points="{coords}" fill="none" stroke="{colour}" stroke-width="1.5"/>')
    last_step, last_value = points[-1]
    parts.append(f'<circle cx="{x(last_step):.1f}" cy="{y(last_value):.1f}" r="2.5" fill="{colour}">'
                 f'<title>{escape(x_label)} {last_step}: {escape(tick(last_value))}</title></circle>')
    parts.append("</svg>")
    return "".join(parts)


thin = thin_points
"""At most ``limit`` points of a series, first and last kept (the trainer's contract defines it)."""


def training_curve_charts(curve: TrainingCurve, *, x_label: str = "step") -> dict[str, str]:
    """A stage's two curve charts: training loss and validation PSNR, over the same steps."""
    return {
        "loss": curve_svg("training loss", curve.loss, y_label="loss", colour=PALETTE[0], x_label=x_label),
        "val_psnr": curve_svg("validation PSNR", curve.val_psnr, y_label="PSNR (dB)", colour=PALETTE[3],
                              x_label=x_label),
    }
