"""Draw a reproduction's figure data (reproductions.spec.Figure as a dict) to PNG and SVG."""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import cycler  # noqa: E402  (matplotlib re-exports it)

# Ten colours, then the same colours dashed, then dotted: past ten series no two look alike
# (matplotlib's default cycle repeats its colours).
STYLE_CYCLE = cycler(linestyle=["-", "--", ":"]) * cycler(color=plt.get_cmap("tab10").colors)
LEGEND_INSIDE_MAX = 6  # more entries than this go beside the axes, not over the data


def render_figure(fig: dict) -> dict[str, bytes]:
    """Return {"png": bytes, "svg": bytes}. Paper series are drawn as hollow markers."""
    f, ax = plt.subplots(figsize=(6.4, 4.0), dpi=110)
    ax.set_prop_cycle(STYLE_CYCLE)
    for s in fig["series"]:
        if s.get("kind") == "paper":
            ax.plot(s["x"], s["y"], linestyle="none", marker="o", mfc="none", label=f"{s['label']} (paper)")
        else:
            ax.plot(s["x"], s["y"], marker=".", label=s["label"])
    # Setting a scale replaces the axis' locator and formatter, which would drop the labels of a
    # categorical (string) axis: only set scales that differ from the default.
    if fig.get("xscale", "linear") != "linear":
        ax.set_xscale(fig["xscale"])
    if fig.get("yscale", "linear") != "linear":
        ax.set_yscale(fig["yscale"])
    ax.set_xlabel(fig["xlabel"])
    ax.set_ylabel(fig["ylabel"])
    ax.set_title(fig["title"], fontsize=10)
    ax.grid(True, alpha=0.3)
    if len(fig["series"]) > LEGEND_INSIDE_MAX:
        f.set_figwidth(9.0)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    else:
        ax.legend(fontsize=8)
    f.tight_layout()
    out = {}
    for fmt in ("png", "svg"):
        buf = io.BytesIO()
        f.savefig(buf, format=fmt)
        out[fmt] = buf.getvalue()
    plt.close(f)
    return out
