#!/usr/bin/env python3
"""Turn `sparsek bench --json FILE` output into PNG bar charts (headless).

One panel per workload: effective TFLOPS of every measured variant (peers hatched), with a dashed
line at the "ideal" (effective flops at the measured cuBLAS dense rate). Rows that did not run
(unsupported / failed) are listed under the bars instead of being drawn.

    python3 bench/plot.py build/bench.json -o docs/bench.png [--per-workload]
"""
import argparse
import json
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")  # no display needed
import matplotlib.pyplot as plt  # noqa: E402


def measured(row):
    v = row.get("effective_tflops")
    return row.get("status") == "ok" and v is not None and math.isfinite(v)


def draw(ax, w, unit_scale, unit):
    rows = w["variants"]
    ok = [r for r in rows if measured(r)]
    names = [r["name"] for r in ok]
    vals = [r["effective_tflops"] * unit_scale for r in ok]
    colors = ["#999999" if r["peer"] else "#1f77b4" for r in ok]
    bars = ax.bar(range(len(ok)), vals, color=colors, edgecolor="black", linewidth=0.5)
    for b, r in zip(bars, ok):
        if r["peer"]:
            b.set_hatch("//")
        if r.get("wrong"):
            b.set_color("#d62728")
    for i, v in enumerate(vals):
        ax.text(i, v, f"{v:.0f}" if v >= 10 else f"{v:.2g}", ha="center", va="bottom", fontsize=7)
    ideal = w.get("ideal_effective_tflops")
    if ideal is not None and math.isfinite(ideal):
        ax.axhline(ideal * unit_scale, color="#2ca02c", linestyle="--", linewidth=1)
        ax.text(len(ok) - 0.5, ideal * unit_scale, f"ideal {ideal * unit_scale:.0f}", color="#2ca02c",
                ha="right", va="bottom", fontsize=7)
    ax.set_xticks(range(len(ok)))
    ax.set_xticklabels(names, rotation=35, ha="right", fontsize=7)
    ax.set_ylabel(f"effective {unit}")
    ax.set_title(f"{w['label']} {w['pattern']} {w['dtype']}", fontsize=9)
    skipped = [f"{r['name']}: {r['status']}" for r in rows if not measured(r)]
    if skipped:
        ax.text(0.01, 0.98, "\n".join(skipped), transform=ax.transAxes, fontsize=6, va="top", color="#555555")
    ax.set_ylim(0, max(vals + [ideal * unit_scale if ideal else 0] + [1e-9]) * 1.15)


def title_of(doc):
    dev = doc.get("device", {})
    who = dev.get("name") if dev.get("available") else "CPU backend (no GPU)"
    return f"sparsek {doc.get('sparsek_version', '?')} bench on {who}, {doc.get('date', '')}"


def markdown_table(doc):
    """One row per workload, one column per variant: effective TFLOPS (docs/BENCHMARKS.md)."""
    ws = doc.get("workloads", [])
    names = []
    for w in ws:
        for v in w.get("variants", []):
            if v["name"] not in names:
                names.append(v["name"])
    head = "| workload | " + " | ".join(n + (" *" if any(v["name"] == n and v.get("peer") for w in ws
                                                            for v in w["variants"]) else "")
                                         for n in names) + " | ideal |"
    lines = [head, "|---" * (len(names) + 2) + "|"]
    for w in ws:
        cells = []
        for n in names:
            v = next((v for v in w["variants"] if v["name"] == n), None)
            ok = v is not None and v.get("status") == "ok" and v.get("effective_tflops") is not None
            cells.append(f"{v['effective_tflops']:.1f}" if ok else "-")
        ideal = w.get("ideal_effective_tflops")
        cells.append(f"{ideal:.0f}" if ideal else "-")
        lines.append(f"| {w['label']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", help="file written by `sparsek bench --json`")
    ap.add_argument("-o", "--out", default=None, help="PNG path (default: next to the JSON)")
    ap.add_argument("--per-workload", action="store_true", help="also one PNG per workload (<out>-<i>.png)")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table of effective TFLOPS instead")
    a = ap.parse_args(argv)
    with open(a.json) as f:
        doc = json.load(f)
    if a.markdown:
        print(markdown_table(doc))
        return 0
    ws = doc.get("workloads", [])
    if not ws:
        print(f"{a.json}: no workloads", file=sys.stderr)
        return 1
    gpu = doc.get("mode") == "gpu"
    unit_scale, unit = (1.0, "TFLOPS") if gpu else (1e3, "GFLOPS")
    out = a.out or os.path.splitext(a.json)[0] + ".png"

    cols = min(3, len(ws))
    rows = math.ceil(len(ws) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 4.2 * rows), squeeze=False)
    for i, w in enumerate(ws):
        draw(axes[i // cols][i % cols], w, unit_scale, unit)
    for j in range(len(ws), rows * cols):
        axes[j // cols][j % cols].axis("off")
    fig.suptitle(title_of(doc), fontsize=10)
    # Leave the top 0.4 inch to the title (tight_layout alone lets the first row's titles cross it).
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.4 / fig.get_figheight()))
    fig.savefig(out, dpi=130)
    plt.close(fig)
    written = [out]
    if a.per_workload:
        base = os.path.splitext(out)[0]
        for i, w in enumerate(ws):
            fig, ax = plt.subplots(figsize=(6, 4.2))
            draw(ax, w, unit_scale, unit)
            fig.suptitle(title_of(doc), fontsize=8)
            fig.tight_layout()
            p = f"{base}-{i + 1}.png"
            fig.savefig(p, dpi=130)
            plt.close(fig)
            written.append(p)
    for p in written:
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
