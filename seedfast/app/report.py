"""The demo report: success vs update per algorithm and the no-learning control (PNG), and a markdown page of
what was measured."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from seedfast.rollout.collect import write_text_atomic
from seedfast.runtime.paths import RunPaths

# per-update metrics that say whether the teacher carried signal (means over updates in the report): the ones that
# are not signed by construction (train/teacher_evidence.py)
EVIDENCE = ("skill/parse_rate", "samples/teacher_valid_rate", "teacher/contrast", "teacher/raised_win",
            "teacher/raised_lose", "teacher/opd_share", "train/groups_with_signal", "time/step")
# Below this share of the update the teacher cannot make SEED differ from GRPO: the part that depends on what the
# teacher says is smaller still (the gate's ≈ share·(β/4)·contrast), and at 3.5% (the study's gate arm) and 0.6-0.8%
# (the demo's SEED) SEED was GRPO within the seeds' spread (docs/demo.md, 'What it measures and why it is built this
# way').
SMALL_TEACHER_SHARE = 0.05


def curve_means(curve: Sequence[float]) -> dict[str, float]:
    """Mean success over the first quarter and the last half of the updates, and over all of them."""
    n = len(curve)
    if not n:
        return {}
    quarter = max(1, math.ceil(n / 4))
    half = curve[n // 2:] if n > 1 else curve
    return {"first_quarter": sum(curve[:quarter]) / quarter, "last_half": sum(half) / len(half),
            "all": sum(curve) / n}


def teacher_share(history: Sequence[dict[str, Any]]) -> float | None:
    """`teacher/opd_share` (train/teacher_evidence.py: the OPD term's part of the update's ℓθ-gradient), mean over
    the updates that log it; None where none does (GRPO, or a full-vocabulary OPD form, which logs no share)."""
    values = [r["teacher/opd_share"] for r in history if r.get("teacher/opd_share") is not None]
    return sum(values) / len(values) if values else None


def teacher_shares(histories: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per algorithm with a teacher (its updates log teacher/* metrics): its share of the update, whether it is below
    SMALL_TEACHER_SHARE, and the sentence the report prints."""
    out = {}
    for name, history in histories.items():
        if not any(k.startswith("teacher/") for r in history for k in r):
            continue
        share = teacher_share(history)
        small = None if share is None else share < SMALL_TEACHER_SHARE
        out[name] = {"opd_share": share, "too_small": small, "threshold": SMALL_TEACHER_SHARE,
                     "note": teacher_share_note(name, share)}
    return out


def teacher_share_note(name: str, share: float | None) -> str:
    """The teacher's share of an algorithm's update in words, and, below SMALL_TEACHER_SHARE, that it is too small for
    the algorithm to differ from GRPO."""
    who = name.upper()
    if share is None:
        return (f"{who}'s teacher share of the update: not logged (its OPD form pushes every logit, not the sampled "
                "token's log-prob, so no share is measured).")
    text = f"{who}'s teacher is {share:.1%} of its update (`teacher/opd_share`, mean over updates)"
    if share < SMALL_TEACHER_SHARE:
        return (text + f": below {SMALL_TEACHER_SHARE:.0%}, too small for {who} to differ from GRPO. Here {who} is "
                "GRPO in effect; a difference between their numbers is the run's noise, not the teacher.")
    return text + "."


def write_json(path: Path, data: Any) -> Path:
    """JSON written whole, then renamed into place (rollout/collect.py write_text_atomic): a reader sees the old
    file or the new one, never half of one."""
    write_text_atomic(path, json.dumps(data, indent=1))
    return path


def held_out_points(histories: dict[str, list[dict[str, Any]]], before: float,
                    after: dict[str, dict[str, float]]) -> dict[str, list[tuple[int, float]]]:
    """The held-out panel, per algorithm: the SFT start at update 0 and the final evaluation after its last update,
    the very numbers the report's table prints (one evaluation path: train/evaluate.py evaluate_policy)."""
    return {name: [(0, before), (len(histories[name]), m["eval/success_rate"])] for name, m in after.items()}


def plot_curves(histories: dict[str, list[dict[str, Any]]], path: Path, floor: float | None,
                held_out: dict[str, list[tuple[int, float]]], before: float | None,
                control: list[dict[str, Any]] | None = None) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # the report extra is optional; the markdown still has every number
        return None
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    if control:
        axes[0].plot([r["step"] + 1 for r in control], [r["train/success_rate"] for r in control], color="grey",
                     linestyle="--", marker=".", label="no-learning control")
    for name, rows in histories.items():
        steps = [r["step"] + 1 for r in rows]
        axes[0].plot(steps, [r.get("train/success_rate", float("nan")) for r in rows], marker="o", label=name)
    for name, points in held_out.items():
        axes[1].plot(*zip(*points), marker="s", label=name)
    for ax, title in zip(axes, ("training-pool success (rollouts, T=1.0)", "held-out success (eval)")):
        if floor is not None and ax is axes[1]:
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
                 after: dict[str, dict[str, float]], timings: dict[str, float], setup: dict[str, Any],
                 control: list[dict[str, Any]] | None = None, job_seconds: dict[str, float] | None = None) -> Path:
    held_out = held_out_points(histories, before["eval/success_rate"], after)
    paths = RunPaths(run_dir)
    png = plot_curves(histories, paths.report_png, floor, held_out, before["eval/success_rate"], control)
    lines = ["# seedfast CPU demo", "", "Measured on this run, whatever it shows.", ""]
    lines += [f"- {k}: {v}" for k, v in setup.items()]
    lines += ["", "| policy | held-out success | invalid-action rate | episode length |", "|---|---|---|---|"]
    lines.append(f"| random admissible commands | {floor:.3f} | – | – |")
    lines.append(f"| SFT (start of RL) | {before['eval/success_rate']:.3f} | {before['eval/invalid_rate']:.3f} | "
                 f"{before['eval/episode_length']:.2f} |")
    for name, m in after.items():
        lines.append(f"| {name} after {len(histories[name])} updates | {m['eval/success_rate']:.3f} | "
                     f"{m['eval/invalid_rate']:.3f} | {m['eval/episode_length']:.2f} |")
    shares = teacher_shares(histories)
    if shares:
        lines += ["", *(v["note"] for v in shares.values())]
    curves = {**({"control (no learning)": control} if control else {}), **histories}
    lines += ["", "Training-pool success per update (rollouts at the training temperature; the control rolls out "
              "the SFT policy on the same games with the same sampling seeds and never updates):", ""]
    names = list(curves)
    lines.append("| update | " + " | ".join(names) + " |")
    lines.append("|---|" + "---|" * len(names))
    for i in range(max(len(h) for h in curves.values())):
        cells = [f"{h[i]['train/success_rate']:.3f}" if i < len(h) else "" for h in curves.values()]
        lines.append(f"| {i + 1} | " + " | ".join(cells) + " |")
    means = {name: curve_means([r["train/success_rate"] for r in h]) for name, h in curves.items()}
    for label, key in (("first quarter", "first_quarter"), ("last half", "last_half")):
        lines.append(f"| mean, {label} | " + " | ".join(f"{means[n][key]:.3f}" for n in names) + " |")
    for name, h in histories.items():
        found = {k: sum(r.get(k, 0.0) for r in h) / len(h) for k in EVIDENCE if any(k in r for r in h)}
        if found:
            lines.append("")
            lines.append(f"{name} means over updates: " + ", ".join(f"{k} {v:.3f}" for k, v in found.items()))
    lines += ["", "Wall time per phase (s): " + ", ".join(f"{k} {v:.0f}" for k, v in timings.items())]
    if job_seconds:
        lines.append("Each job after SFT, in its lane, side by side (s): "
                     + ", ".join(f"{k} {v:.0f}" for k, v in job_seconds.items()))
    if png is not None:
        lines += ["", f"![success vs update]({png.name})"]
    path = paths.report_md
    tmp = path.with_suffix(".md.tmp")
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, path)
    return path
