"""Bar chart of sparsek's time ratios against FlashAttention-4 from a `torch_peers.py --attention`
JSON: FA4's time / sparsek's (> 1: sparsek faster) for the forward, the backward (one call) and
the training step, per case.   python3 bench/plot_fa4.py RESULTS.json OUT.png"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src, dst):
    d = json.load(open(src))
    cases, series = [], {"forward": [], "backward (one call)": [], "training step": []}
    for r in d["records"]:
        sk, fa = r["results"].get("sparsek", {}), r["results"].get("fa4", {})
        if "fwd_ms" not in sk or "fwd_ms" not in fa:
            continue
        cases.append(r["case"])
        series["forward"].append(fa["fwd_ms"] / sk["fwd_ms"])
        both = lambda k: fa[k] / sk[k] if k in sk and k in fa else float("nan")  # noqa: E731
        series["backward (one call)"].append(both("bwd_ms"))
        series["training step"].append(both("step_ms"))
    fig, ax = plt.subplots(figsize=(8, 3.6))
    w = 0.27
    for i, (name, vals) in enumerate(series.items()):
        ax.bar([x + (i - 1) * w for x in range(len(cases))], vals, w, label=name)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(cases)), cases)
    ax.set_ylabel("FA4 time / sparsek time")
    gpu = d["header"].get("gpu", "") if isinstance(d.get("header"), dict) else ""
    # torch_peers times each call from an idle GPU: each library's host time before its first kernel counts.
    ax.set_title(f"{gpu}: calls timed from an idle GPU (host time included)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main(*sys.argv[1:3])
