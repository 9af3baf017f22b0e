"""The demo report: success vs update per algorithm (PNG) and a short markdown table of what was measured."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def plot_curves(histories: dict[str, list[dict[str, Any]]], path: Path, floor: float | None,
                before: float | None) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # the report extra is optional; the markdown still has every number
        return None
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for name, rows in histories.items():
        steps = [r["step"] + 1 for r in rows]
        axes[0].plot(steps, [r.get("train/success_rate", float("nan")) for r in rows], marker="o", label=name)
        evals = [(r["step"] + 1, r["eval/success_rate"]) for r in rows if "eval/success_rate" in r]
        if evals and before is not None:
            evals.insert(0, (0, before))  # every algorithm starts from the same SFT policy
        if evals:
            axes[1].plot(*zip(*evals), marker="s", label=name)
    for ax, title in zip(axes, ("training-pool success (rollouts, T=1.0)", "held-out success (eval)")):
        if floor is not None:
            ax.axhline(floor, color="grey", linestyle=":", label="random policy (held-out)")
        if before is not None and ax is axes[1]:
            ax.axhline(before, color="black", linestyle="--", label="SFT start")
        ax.set_xlabel("RL update")
        ax.set_ylabel("success rate")
        ax.set_title(title)
        ax.set_ylim(-0.02, 1.02)
        ax.legend(fontsize=8)
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
    return path


def write_report(run_dir: Path, histories: dict[str, list[dict[str, Any]]], *, floor: float, before: dict[str, float],
                 after: dict[str, dict[str, float]], timings: dict[str, float], setup: dict[str, Any]) -> Path:
    png = plot_curves(histories, run_dir / "report.png", floor, before.get("eval/success_rate"))
    lines = ["# seedfast CPU demo", "", "Measured on this run, whatever it shows.", ""]
    lines += [f"- {k}: {v}" for k, v in setup.items()]
    lines += ["", "| policy | held-out success | invalid-action rate | episode length |", "|---|---|---|---|"]
    lines.append(f"| random admissible commands | {floor:.3f} | – | – |")
    lines.append(f"| SFT (start of RL) | {before['eval/success_rate']:.3f} | {before['eval/invalid_rate']:.3f} | "
                 f"{before['eval/episode_length']:.2f} |")
    for name, m in after.items():
        lines.append(f"| {name} after {len(histories[name])} updates | {m['eval/success_rate']:.3f} | "
                     f"{m['eval/invalid_rate']:.3f} | {m['eval/episode_length']:.2f} |")
    lines += ["", "Training-pool success per update (rollouts at the training temperature):", ""]
    names = list(histories)
    lines.append("| update | " + " | ".join(names) + " |")
    lines.append("|---|" + "---|" * len(names))
    for i in range(max(len(h) for h in histories.values())):
        cells = [f"{h[i]['train/success_rate']:.3f}" if i < len(h) else "" for h in histories.values()]
        lines.append(f"| {i + 1} | " + " | ".join(cells) + " |")
    extra = [k for k in ("skill/parse_rate", "loss/gate_mean", "loss/opd_term", "time/step")]
    for name, h in histories.items():
        means = {k: sum(r.get(k, 0.0) for r in h) / len(h) for k in extra if any(k in r for r in h)}
        if means:
            lines.append("")
            lines.append(f"{name} means over updates: " + ", ".join(f"{k} {v:.3f}" for k, v in means.items()))
    lines += ["", "Wall time per phase (s): " + ", ".join(f"{k} {v:.0f}" for k, v in timings.items())]
    if png is not None:
        lines += ["", f"![success vs update]({png.name})"]
    path = run_dir / "report.md"
    tmp = path.with_suffix(".md.tmp")
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, path)
    return path
