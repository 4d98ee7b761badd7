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


def summary_markdown(setups, roofline=None, meta=None):
    """The summary table (markdown): one row per setup and depth, the decode roofline fraction beside."""
    meta = meta or {}
    lines = ["# minimax-spark bench", ""]
    for key in ("endpoint", "model", "date", "bandwidth_gbs", "active_bytes_per_token", "note"):
        if meta.get(key) not in (None, ""):
            lines.append("- %s: %s" % (key.replace("_", " "), meta[key]))
    if roofline:
        lines.append("- decode roofline: %.1f tok/s (active bytes per token / memory bandwidth)" % roofline)
    lines += ["", "| setup | depth | prefill tok/s | decode tok/s | decode / roofline |", "|---|---:|---:|---:|---:|"]
    for setup in setups:
        for row in setup.get("rows", []):
            fraction = (row["tg"] / roofline) if (roofline and row.get("tg")) else None
            lines.append("| %s | %d | %s | %s | %s |" % (
                setup["name"], row["depth"], _fmt(row.get("pp")), _fmt(row.get("tg")),
                "-" if fraction is None else "%.1f%%" % (100 * fraction)))
    for setup in setups:
        spec = setup.get("spec") or {}
        if spec.get("drafted"):
            lines.append("")
            lines.append("%s: speculative decoding accepted %d of %d drafted tokens (%.0f%%), decode %s tok/s "
                         "(llama-server's timings)" % (setup["name"], spec.get("accepted", 0), spec["drafted"],
                                                       100.0 * spec.get("accepted", 0) / spec["drafted"],
                                                       _fmt(spec.get("decode"))))
    if meta.get("winner"):
        lines += ["", "Winner (%s): **%s**" % (meta.get("winner_metric", "decode"), meta["winner"])]
    return "\n".join(lines) + "\n"


def plot(setups, dest, roofline=None, title="minimax-spark bench"):
    """Prefill and decode tok/s against depth, one line per setup, side by side; PNG at dest."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_pp, ax_tg) = plt.subplots(1, 2, figsize=(11, 4.2))
    for setup in setups:
        rows = [r for r in setup.get("rows", [])]
        depths = [r["depth"] for r in rows]
        ax_pp.plot(depths, [r.get("pp") for r in rows], marker="o", label=setup["name"])
        ax_tg.plot(depths, [r.get("tg") for r in rows], marker="o", label=setup["name"])
    if roofline:
        ax_tg.axhline(roofline, linestyle="--", color="grey", label="roofline %.0f tok/s" % roofline)
    for ax, what in ((ax_pp, "prefill"), (ax_tg, "decode")):
        ax.set_title(what)
        ax.set_xlabel("context depth (tokens)")
        ax.set_ylabel("tok/s")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle(title)
    fig.tight_layout()
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
    plot(setups, paths["plot"], roofline, title="minimax-spark bench %s" % meta.get("date", ""))
    paths["summary_text"] = text
    return paths
