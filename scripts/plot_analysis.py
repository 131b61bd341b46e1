#!/usr/bin/env python3
"""Plot `kvtier analyze --json` output: attention-mass recall (vs the oracle)
and relative attention-output error by layer, one line per policy.

usage: python3 scripts/plot_analysis.py analysis.json out.png
"""
import json
import sys


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_analysis.py needs matplotlib: pip install matplotlib", file=sys.stderr)
        return 1
    with open(sys.argv[1]) as f:
        data = json.load(f)
    policies = data.get("policies")
    if not policies:
        print(f"{sys.argv[1]}: no 'policies' (expected kvtier analyze --json output)",
              file=sys.stderr)
        return 1
    fig, (ax_mass, ax_err) = plt.subplots(1, 2, figsize=(13, 4.5))
    for p in policies:
        layers = range(len(p["layers"]))
        label = f"{p['policy']} ({p['gpu_bytes_per_token']:.0f} B/tok)"
        ax_mass.plot(layers, [l["mass_recall"] for l in p["layers"]], marker=".", label=label)
        ax_err.plot(layers, [l["rel_error"] for l in p["layers"]], marker=".", label=label)
    ax_mass.set_xlabel("layer")
    ax_mass.set_ylabel("attention-mass recall vs oracle")
    ax_err.set_xlabel("layer")
    ax_err.set_ylabel("relative attention-output error")
    ax_err.set_yscale("log")
    ax_mass.legend(fontsize=7)
    fig.suptitle(f"{data.get('model', '')}: prompt {data.get('n_prompt')} tokens, "
                 f"{data.get('steps')} decode steps")
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=120)
    print(f"wrote {sys.argv[2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
