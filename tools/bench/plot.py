"""Charts of benchmark figures (--plot FILE). matplotlib is the optional `plot` extra
(`pip install -e '.[plot]'`), imported only when a chart is drawn."""

from __future__ import annotations

INSTALL_HINT = "--plot needs matplotlib, the optional plot extra: pip install -e '.[plot]' (or pip install matplotlib)"


def pyplot():
    """matplotlib.pyplot on a file backend (Agg), or SystemExit with the line that says how to get it."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit(INSTALL_HINT) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def grouped_bars(path: str, title: str, groups: list[str], series: dict[str, list[float]], ylabel: str) -> None:
    """One group of bars per label in `groups` (e.g. stream counts), one bar per series
    (e.g. K=0, K=7), each bar labelled with its value; written to `path`."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(1.6 + 1.4 * len(groups) * max(1, len(series)) / 2, 3.6))
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        bars = ax.bar(xs, values, width, label=name)
        ax.bar_label(bars, fmt="%.0f", fontsize=8)
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")
