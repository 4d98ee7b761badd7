"""The bench report on the controller: results.json, summary.md and bench.png (matplotlib, Agg).

``setups``: ``[{"name": str, "settings": dict, "rows": [{"depth", "pp", "tg", ...}]}]`` (rows as
``minimax_spark_bench.parse_benchy`` returns them).
"""
from __future__ import annotations

import json
import os

from ansible.module_utils.minimax_spark_files import atomic_path, write_atomic


def _fmt(value, digits=1):
    return "-" if value is None else ("%.*f" % (digits, value))


def _fmt_spread(row, key):
    """A figure with its spread over the repeated runs (``4645.0 ± 31.2``), when there is one."""
    text = _fmt(row.get(key))
    if row.get(key) is not None and row.get(key + "_std"):
        text += " ± %.1f" % row[key + "_std"]
    return text


def summary_markdown(setups, roofline=None, meta=None):
    """The summary table (markdown): one row per setup and depth, the decode roofline fraction beside."""
    meta = meta or {}
    lines = ["# minimax-spark bench", ""]
    for key in ("endpoint", "model", "date", "bandwidth_gbs", "active_bytes_per_token", "note"):
        if meta.get(key) not in (None, ""):
            lines.append("- %s: %s" % (key.replace("_", " "), meta[key]))
    if roofline:
        lines.append("- decode roofline: %.1f tok/s (active bytes per token / memory bandwidth)" % roofline)
    for link in meta.get("links") or []:
        lines.append("- " + _link_text(link))
    lines += ["", "| setup | depth | prefill tok/s | decode tok/s | decode / roofline |", "|---|---:|---:|---:|---:|"]
    for setup in setups:
        for row in setup.get("rows", []):
            fraction = (row["tg"] / roofline) if (roofline and row.get("tg")) else None
            lines.append("| %s | %d | %s | %s | %s |" % (
                setup["name"], row["depth"], _fmt_spread(row, "pp"), _fmt_spread(row, "tg"),
                "-" if fraction is None else "%.1f%%" % (100 * fraction)))
    for setup in setups:
        spec = setup.get("spec") or {}
        if not spec:
            continue
        lines.append("")
        if spec.get("drafted"):
            lines.append("%s: speculative decoding accepted %d of %d drafted tokens (%.0f%%), decode %s tok/s "
                         "(llama-server's timings)" % (setup["name"], spec.get("accepted", 0), spec["drafted"],
                                                       100.0 * spec.get("accepted", 0) / spec["drafted"],
                                                       _fmt(spec.get("decode"))))
        elif spec.get("type", "none") == "none":
            lines.append("%s: speculative decoding off, decode %s tok/s (llama-server's timings)"
                         % (setup["name"], _fmt(spec.get("decode"))))
        else:
            lines.append("%s: speculative decoding drafted nothing, decode %s tok/s (llama-server's timings)"
                         % (setup["name"], _fmt(spec.get("decode"))))
    if meta.get("winner"):
        lines += ["", "Winner (%s): **%s**" % (meta.get("winner_decided_by") or meta.get("winner_metric", "decode"),
                                               meta["winner"])]
    if meta.get("winner_rule"):
        lines += ["", "Rule: %s." % meta["winner_rule"]]
    return "\n".join(lines) + "\n"


def _link_text(link):
    """One worker's link as bench.yml measured it (iperf3 head -> worker)."""
    return "link head -> %s (%s): %s Gbit/s, rtt %s ms over %s s (iperf3)" % (
        link.get("worker"), link.get("address"), _fmt(link.get("gbit_s"), 2), _fmt(link.get("mean_rtt_ms"), 3),
        _fmt(link.get("seconds"), 0))


def figure(setups, roofline=None, title="minimax-spark bench", links=None):
    """The matplotlib figure: prefill and decode tok/s against depth, one line per setup, side by side.

    The decode axis spans the measured figures; the roofline is a line on it only when it is near them
    (within twice the fastest), and always the right-hand scale (percent of the roofline) and the title, so
    a roofline far above the measured decode does not squash its lines onto the axis. ``links`` (bench.yml's
    iperf3 figures) are written beside decode.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_pp, ax_tg) = plt.subplots(1, 2, figsize=(11, 4.2))
    measured = []
    for setup in setups:
        rows = [r for r in setup.get("rows", [])]
        depths = [r["depth"] for r in rows]
        ax_pp.errorbar(depths, [r.get("pp") for r in rows], yerr=[r.get("pp_std") or 0 for r in rows],
                       marker="o", capsize=3, label=setup["name"])
        ax_tg.errorbar(depths, [r.get("tg") for r in rows], yerr=[r.get("tg_std") or 0 for r in rows],
                       marker="o", capsize=3, label=setup["name"])
        measured += [r["tg"] for r in rows if r.get("tg")]
    ax_tg.set_title("decode")
    if measured:
        top = max(measured)
        ax_tg.set_ylim(0, top * 1.15)
    if roofline:
        if measured and roofline <= 2 * max(measured):
            ax_tg.axhline(roofline, linestyle="--", color="grey", label="roofline %.0f tok/s" % roofline)
            ax_tg.set_ylim(0, roofline * 1.1)
        ax_tg.set_title("decode (roofline %.0f tok/s)" % roofline)
        right = ax_tg.secondary_yaxis("right", functions=(lambda v: 100.0 * v / roofline,
                                                          lambda p: p * roofline / 100.0))
        right.set_ylabel("% of the roofline")
    ax_pp.set_title("prefill")
    for ax in (ax_pp, ax_tg):
        ax.set_xlabel("context depth (tokens)")
        ax.set_ylabel("tok/s")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    if links:  # the link each token crosses twice per split, beside decode
        ax_tg.text(0.02, 0.02, "\n".join(_link_text(link) for link in links), transform=ax_tg.transAxes,
                   fontsize="x-small", va="bottom", color="dimgrey")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot(setups, dest, roofline=None, title="minimax-spark bench", links=None):
    """Write :func:`figure` as a PNG at dest."""
    import matplotlib.pyplot as plt

    fig = figure(setups, roofline, title, links)
    try:
        with atomic_path(dest, suffix=".tmp.png") as tmp:
            fig.savefig(tmp, dpi=100)
    finally:
        plt.close(fig)
    return dest


def write_report(outdir, setups, roofline=None, meta=None):
    """results.json, summary.md and bench.png in outdir; return their paths."""
    os.makedirs(outdir, exist_ok=True)
    meta = dict(meta or {})
    paths = {
        "json": os.path.join(outdir, "results.json"),
        "summary": os.path.join(outdir, "summary.md"),
        "plot": os.path.join(outdir, "bench.png"),
    }
    for setup in setups:
        for row in setup.get("rows", []):
            row["roofline_fraction"] = round(row["tg"] / roofline, 3) if (roofline and row.get("tg")) else None
    data = dict(meta, decode_roofline=roofline, setups=setups)
    write_atomic(paths["json"], json.dumps(data, indent=2, sort_keys=True))
    text = summary_markdown(setups, roofline, meta)
    write_atomic(paths["summary"], text)
    plot(setups, paths["plot"], roofline, title="minimax-spark bench %s" % meta.get("date", ""),
         links=meta.get("links"))
    paths["summary_text"] = text
    return paths
