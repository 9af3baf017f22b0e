"""What the tiny-model study's data supports, read from experiments/results/study.json after its answer (issue #54):
the criterion's power at the measured spreads, clause 5 at a start that trips the collapse rules with no update, the
seed where λ was chosen, the teacher's share of the update at the chosen weights, what the intervals rule out, and
the starts that cannot use a skill. Not pre-registered: a reading beside the criterion, never in its place.
docs/study.md's generated "Result" (experiments/study.py docs_section) puts it right after the answer.

    facts(data)           # the numbers, from study.json as loaded
    reading_lines(data)   # the paragraph and its parts, in words

The power is simulated: the six paired differences d_s drawn independent and normal around a true effect δ with
the measured s_d as their spread, one seeded set of draws for every δ and every s_d, so each part of the criterion
holds above a threshold of δ per draw (`minimal_effects`) and the power at any δ is the share of draws whose
threshold it reaches.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from experiments import study
from experiments.study import FORMS, MARGIN, SEEDS, mean

DRAWS = 200_000  # the power's sampling error: about 0.001
POWER_SEED = 0
POWER = 0.8  # the effect reported is the one the criterion finds this often
CLAUSE_1 = ("mean", "interval")  # d̄ ≥ MARGIN and the interval's lower end > 0
CLAUSES_1_2 = ("mean", "interval", "positive")
_f, _signed = study._f, study._signed  # the Result's number formats
CRITERION_FIRST = 4  # pool success over updates 4-16 (docs/study.md, 'The criterion')
ARMS = (*FORMS, "shuffled", "self")


# ------------------------------------------------------------------ the criterion's power


def minimal_effects(sd: float, n: int = len(SEEDS), draws: int = DRAWS, seed: int = POWER_SEED
                    ) -> dict[str, np.ndarray]:
    """Per simulated study of n paired differences d_s = δ + sd·z (z standard normal, the same draws for every δ
    and sd), the smallest δ at which each part of the criterion holds: "mean" d̄ ≥ MARGIN, "interval" the 95%
    t-interval's lower end d̄ − t(0.975, n − 1)·s_d/√n > 0, "positive" d_s > 0 at ≥ study.POSITIVE of the n."""
    z = np.random.default_rng(seed).standard_normal((draws, n))
    zbar, zsd = z.mean(axis=1), z.std(axis=1, ddof=1)
    t = study.t_quantile(0.975, n - 1)
    return {"mean": MARGIN - sd * zbar,
            "interval": sd * (t * zsd / math.sqrt(n) - zbar),
            "positive": np.sort(-sd * z, axis=1)[:, study.POSITIVE - 1]}


def power(mins: dict[str, np.ndarray], effect: float, parts: Sequence[str] = CLAUSE_1) -> float:
    """The share of the simulated studies in which every part in `parts` holds at the true effect `effect`."""
    return float((np.max([mins[p] for p in parts], axis=0) <= effect).mean())


def effect_for_power(mins: dict[str, np.ndarray], parts: Sequence[str] = CLAUSE_1, share: float = POWER) -> float:
    """The smallest true effect at which every part in `parts` holds in `share` of the simulated studies."""
    return float(np.quantile(np.max([mins[p] for p in parts], axis=0), share))


def power_facts(a: dict) -> dict[str, Any] | None:
    """Clause 1's power at a true +MARGIN and the effect it finds POWER of the time, at each arm's measured s_d."""
    out = {}
    for arm in ARMS:
        sd = (a.get(arm) or {}).get("sd")
        if sd is None:
            continue
        mins = minimal_effects(sd, n=a[arm]["seeds"])
        out[arm] = {"sd": sd, "n": a[arm]["seeds"], "at_margin": power(mins, MARGIN),
                    "at_margin_clauses_1_2": power(mins, MARGIN, CLAUSES_1_2), "effect": effect_for_power(mins),
                    "effect_interval": effect_for_power(mins, ("interval",))}
    return out if a.get("primary") in out else None


# ------------------------------------------------------------------ the other facts


def clause5_facts(a: dict, data: dict, pool: str | None) -> list[dict[str, Any]]:
    """Per seed where the primary collapsed: its rules, the control's (it makes no update), the control's updates
    whose invalid share is above 0.5, the start's own invalid share (the gap's plain plays), and how many of the runs
    that update there escape every rule."""
    runs, starts, gaps = data.get("runs") or {}, data.get("starts") or {}, data.get("teacher_gap") or {}
    out = []
    for s in map(str, a[a["primary"]]["collapsed"]):
        control = runs.get(f"sparse/s{s}/control")
        start = starts.get(f"sparse/s{s}", {}).get("eval/success_rate")
        invalid = [v for v in (control or {}).get("per_update", {}).get("rollout/invalid_rate", []) if v is not None]
        baseline = ((a.get("collapse_baselines") or {}).get(s) or {}).get("control", {})
        updating = [arm for arm in ("grpo", *ARMS) if f"sparse/s{s}/{arm}" in runs]
        out.append({
            "seed": int(s), "rules": [r for r, v in a[a["primary"]]["collapse_rules"][s].items() if v],
            "control_rules": [r for r, v in baseline.items() if v],
            "control_above_half": sum(v > 0.5 for v in invalid), "control_updates": len(invalid),
            "start_invalid": (gaps.get(f"{pool}/s{s}") or {}).get("conditions", {}).get("plain", {}).get(
                "invalid_rate"),
            "runs": len(updating),
            "escaped": [arm for arm in updating
                        if not any(study.collapse(runs[f"sparse/s{s}/{arm}"], control, start).values())]})
    return out


def lambda_facts(data: dict, pool: str | None) -> dict[str, Any] | None:
    """The selection seed's oracle gap, each chosen λ's place in its grid, the larger candidates and how many of them
    collapsed, and whether pool success fell with every step up each grid from the chosen λ."""
    sel = data.get("selection")
    if not sel:
        return None
    seed = sel.get("seed", study.SELECT_SEED)
    places, larger, collapsed, falls = {}, 0, 0, True
    for form in FORMS:
        grid = sorted(sel.get("grid", {}).get(form, study.GRID[form]))
        lam = sel["chosen"][form]
        places[form] = {"lam": lam, "place": grid.index(lam) + 1, "of": len(grid)}
        above = [x for x in grid if x > lam]
        larger += len(above)
        collapsed += sum(study.lam_key(form, x) in sel.get("collapsed", []) for x in above)
        stats = [sel["statistic"][k] for x in (lam, *above) if (k := study.lam_key(form, x)) in sel["statistic"]]
        falls = falls and len(stats) > 1 and all(b < s for s, b in zip(stats, stats[1:]))
    oracle = ((data.get("teacher_gap") or {}).get(f"{pool}/s{seed}") or {}).get("gaps", {}).get("oracle")
    return {"seed": seed, "oracle": oracle, "chosen": places, "larger": larger, "larger_collapsed": collapsed,
            "falls": falls}


def share_facts(data: dict) -> dict[str, dict[str, Any]]:
    """Per arm that logs it, `teacher/opd_share` (the OPD term's part of the ℓθ-gradient): its mean over updates per
    seed, the mean over those seeds, and the arm's λ where the selection chose one."""
    chosen = (data.get("selection") or {}).get("chosen", {})
    runs = data.get("runs") or {}
    out = {}
    for arm in ARMS:
        per_seed = {}
        for s in SEEDS:
            values = [v for v in (runs.get(f"sparse/s{s}/{arm}") or {}).get("per_update", {}).get(
                "teacher/opd_share", []) if v is not None]
            if values:
                per_seed[s] = mean(values)
        if per_seed:
            out[arm] = {"lam": chosen.get(arm), "per_seed": per_seed, "mean": mean(list(per_seed.values()))}
    return out


def shuffle_noise(a: dict, data: dict) -> dict[str, float] | None:
    """The standard deviation a difference of two independent pool-success means would have at the primary's and the
    shuffled arm's pool success, √(p₁(1 − p₁)/N + p₂(1 − p₂)/N) with N their episodes over updates 4–16, root mean
    square over the seeds; and N."""
    runs = data.get("runs") or {}
    variances, episodes = [], 0
    for s in SEEDS:
        pair = [runs.get(f"sparse/s{s}/{arm}") for arm in (a["primary"], "shuffled")]
        if None in pair:
            continue
        episodes = (study.STEPS - CRITERION_FIRST + 1) * pair[0].get("episodes_per_update", 64)
        variances.append(sum(p * (1 - p) / episodes for p in (study.pool_success(r) for r in pair)))
    return {"sd": math.sqrt(mean(variances)), "episodes": episodes} if variances else None


def _above(g: dict, condition: str) -> bool:
    lo = ((g.get("gaps") or {}).get(condition) or {}).get("ci95", [None, None])[0]
    return lo is not None and lo > 0


def _below(g: dict, condition: str) -> bool:
    hi = ((g.get("gaps") or {}).get(condition) or {}).get("ci95", [None, None])[1]
    return hi is not None and hi < 0


def starts_facts(data: dict, pool: str | None) -> dict[str, Any] | None:
    """The starts on the decided pool, the result's and the superseded: where the oracle skill's gap lies above 0,
    where the start's own skill's does and where its mean is below 0, and the seeds whose two starts (two CPUs) have
    oracle gaps clear of 0 on opposite sides."""
    current = {int(k.split("/s")[1]): g for k, g in (data.get("teacher_gap") or {}).items()
               if k.startswith(f"{pool}/s")}
    lost = {s["seed"]: s["teacher_gap"] for s in data.get("superseded") or [] if s.get("teacher_gap")}
    every = [*current.values(), *lost.values()]
    if not every:
        return None
    own = [g for g in every if "own" in (g.get("gaps") or {})]
    flips = [{"seed": seed, "before": old["gaps"]["oracle"]["mean"], "after": current[seed]["gaps"]["oracle"]["mean"]}
             for seed, old in sorted(lost.items()) if seed in current
             and ((_above(old, "oracle") and _below(current[seed], "oracle"))
                  or (_below(old, "oracle") and _above(current[seed], "oracle")))]
    return {"starts": len(every), "oracle_above": sum(_above(g, "oracle") for g in every), "own_starts": len(own),
            "own_above": sum(_above(g, "own") for g in own),
            "own_negative": sum(g["gaps"]["own"]["mean"] < 0 for g in own), "flips": flips}


def facts(data: dict) -> dict[str, Any] | None:
    """Every number of the reading, from study.json as loaded; None before the analysis has an answer."""
    a = data.get("analysis")
    if not a or a.get("answer") is None or a.get("primary") is None:
        return None
    pool = (data.get("pool") or {}).get("name")
    return {"primary": a["primary"], "power": power_facts(a), "clause_5": clause5_facts(a, data, pool),
            "lambda": lambda_facts(data, pool), "share": share_facts(data),
            "intervals": {arm: a[arm]["ci95"] for arm in ARMS if a.get(arm, {}).get("ci95", [None])[0] is not None},
            "primary_minus_shuffled": a.get("primary_minus_shuffled"), "shuffle_noise": shuffle_noise(a, data),
            "starts": starts_facts(data, pool), "pool": pool}


# ------------------------------------------------------------------ in words


def _ci(ci: Sequence[float | None]) -> str:
    return "–" if ci[0] is None else f"[{_signed(ci[0])}, {_signed(ci[1])}]"


def _pct(x: float) -> str:
    return f"{x:.1%}"


def _2(x: float) -> str:
    return f"{x:.2f}"


def power_text(f: dict) -> str | None:
    pw = f["power"]
    if not pw:
        return None
    p = pw[f["primary"]]
    text = (f"**The criterion could hardly pass at the effect it asks for.** Clause 1 needs the observed d̄ ≥ "
            f"{_signed(MARGIN, 2)} and the interval above 0. With the {p['n']} d_s drawn independent and normal "
            f"around a true effect, at the primary's measured s_d {_f(p['sd'])} ({DRAWS:,} simulated studies, seed "
            f"{POWER_SEED}), clause 1 holds {p['at_margin']:.2f} of the time at a true {_signed(MARGIN, 2)} (with "
            f"clause 2 too: {p['at_margin_clauses_1_2']:.2f}); it holds {POWER:.0%} of the time only at a true "
            f"{_signed(p['effect'])} (the interval alone above 0: {_signed(p['effect_interval'])})")
    others = {arm: v for arm, v in pw.items() if arm != f["primary"]}
    if others:
        def span(key: str, fmt) -> str:
            lo, hi = min(v[key] for v in others.values()), max(v[key] for v in others.values())
            return fmt(lo) if fmt(lo) == fmt(hi) else f"{fmt(lo)} to {fmt(hi)}"

        text += (f". At the other arms' s_d ({span('sd', _f)}) it holds {span('at_margin', _2)} "
                 f"of the time at {_signed(MARGIN, 2)}, and {POWER:.0%} of the time at {span('effect', _signed)}")
    return text + ". The protocol sized its seeds without a power analysis."


def clause5_text(f: dict) -> str | None:
    seeds = f["clause_5"]
    if not seeds:
        return None
    shared = all(set(s["rules"]) & set(s["control_rules"]) for s in seeds)
    parts = []
    for s in seeds:
        part = f"seed {s['seed']} (rule {', '.join(s['rules'])})"
        if s["control_rules"]:
            part += (f": the control, which makes no update, trips rule {', '.join(s['control_rules'])} there, its "
                     f"rollouts' invalid-action share above 0.5 at {s['control_above_half']} of "
                     f"{s['control_updates']} updates")
            if s["start_invalid"] is not None:
                part += (f"; the start plays invalid actions {_f(s['start_invalid'])} of the time (the gap's "
                         "plain plays)")
        part += f"; {len(s['escaped'])} of the {s['runs']} runs that update there escape every rule"
        parts.append(part)
    head = (f"**Clause 5 could not hold once the start of seed {', '.join(str(s['seed']) for s in seeds)} existed.**"
            if shared else "**Clause 5.**")
    return (f"{head} The primary `{f['primary']}` collapsed only at " + "; ".join(parts) + "."
            + (" Clause 5 is read as written: the start, not the arm, decided it." if shared else ""))


def lambda_text(f: dict) -> str | None:
    lam = f["lambda"]
    if not lam:
        return None
    oracle = lam["oracle"]
    worse = oracle is not None and oracle["ci95"][1] is not None and oracle["ci95"][1] < 0
    text = f"**λ was chosen at seed {lam['seed']}" + (", where the oracle teacher acts worse than the policy**"
                                                      if worse else "**")
    if oracle is not None:
        text += (f" (its oracle gap {_signed(oracle['mean'])} {_ci(oracle['ci95'])}: the policy reading a correct "
                 f"skill wins {'less' if oracle['mean'] < 0 else 'more'} often than without one)")
    places = [f"`{form}` {c['lam']:g} (" + ("the smallest" if c["place"] == 1 else f"{c['place']} of {c['of']}")
              + ")" for form, c in lam["chosen"].items()]
    text += (f". The chosen λ per form, in its grid: {', '.join(places)}; of the {lam['larger']} larger candidates "
             f"{lam['larger_collapsed']} collapsed there"
             + (", and pool success fell with every step up each grid from the chosen λ" if lam["falls"] else ""))
    return text + "."


def share_text(f: dict) -> str | None:
    share = f["share"]
    if not share:
        return None
    logged = []
    for arm, v in share.items():
        seeds = v["per_seed"]
        logged.append(f"`{arm}`" + (f" at λ {v['lam']:g}" if v["lam"] is not None else "") + f" {_pct(v['mean'])} ("
                      + (f"{_pct(min(seeds.values()))} to {_pct(max(seeds.values()))} over seeds "
                         f"{', '.join(map(str, seeds))})" if len(seeds) > 1 else f"seed {next(iter(seeds))})"))
    missing = [f"`{arm}`" for arm in ARMS if arm not in share and arm in f["intervals"]]
    return ("**The teacher's share of the update** (`teacher/opd_share`, the OPD term's part of the ℓθ-gradient, "
            "mean over updates, then over seeds): " + "; ".join(logged)
            + (f". {', '.join(missing)} log none: their full-vocabulary form pushes every logit, not ℓθ "
               "(`seedfast/train/teacher_evidence.py`)" if missing else "") + ".")


def interval_text(f: dict) -> str:
    primary, ci = f["primary"], f["intervals"][f["primary"]]
    kept = [arm for arm, c in f["intervals"].items() if c[1] >= MARGIN]
    text = (f"**What the intervals rule out.** The primary `{primary}` at {_signed(MARGIN, 2)}: its interval "
            f"{_ci(ci)} ends " + ("below it" if ci[1] < MARGIN else "above it, so it does not") + ". They do not "
            f"rule out a gain of the primary up to {_signed(ci[1])}, nor a loss down to {_signed(ci[0])}")
    if kept and kept != [primary]:
        text += f"; nor {_signed(MARGIN, 2)} for " + ", ".join(
            f"`{arm}` {_ci(f['intervals'][arm])}" for arm in kept if arm != primary)
    text += "."
    pms, noise = f["primary_minus_shuffled"] or {}, f["shuffle_noise"]
    if pms.get("sd") is not None and noise is not None:
        text += (f" Primary − shuffled is {_signed(pms['mean'])} {_ci(pms['ci95'])}, its per-seed s_d {_f(pms['sd'])}"
                 f" against {_f(noise['sd'])} for two independent means of {noise['episodes']} episodes at the two "
                 "arms' pool success: the per-seed differences are the size of sampling noise, so nothing shows the "
                 f"skill's content mattering, and nothing rules out {_signed(pms['ci95'][1])} from it.")
    return text


def starts_text(f: dict) -> str | None:
    st = f["starts"]
    if not st:
        return None
    text = (f"**The starts.** On {f['pool']}, of the {st['starts']} starts measured (the result's and the superseded),"
            f" the oracle skill's gap lies above 0 at {st['oracle_above']}: at the other "
            f"{st['starts'] - st['oracle_above']} the model cannot use even a correct skill")
    if st["own_starts"]:
        text += (f"; its own skill's gap lies above 0 at {st['own_above']} of {st['own_starts']} (its mean below 0 "
                 f"at {st['own_negative']})")
    if st["flips"]:
        text += (". A start's gap is not its seed's: remade on another CPU, " + "; ".join(
            f"seed {x['seed']} {_signed(x['before'])} → {_signed(x['after'])}" for x in st["flips"])
            + ", each interval clear of 0 on its side")
    return text + "."


def summary_text(f: dict) -> str:
    text = "**What the data supports** (a reading after the answer, not pre-registered; each part below): at the "
    lam = f["lambda"]
    text += ("only weights this model tolerated at the selection seed" if lam and lam["falls"]
             else "weights the selection chose")
    if f["share"]:
        shares = [v["mean"] for v in f["share"].values()]
        text += (f", the teacher's term is too small to matter ({_pct(min(shares))}"
                 + (f" to {_pct(max(shares))}" if len(shares) > 1 else "") + " of the update where it is logged)")
    st = f["starts"]
    if st:
        text += (f", and at {st['starts'] - st['oracle_above']} of {st['starts']} starts the model cannot use even a "
                 "correct skill" + (f"; its own skill's gap lies above 0 at {st['own_above']} of "
                                    f"{st['own_starts']}" if st["own_starts"] else ""))
    text += ". That is narrower than \"SEED's teacher does not help\""
    pw = (f["power"] or {}).get(f["primary"])
    if pw:
        text += (f", and the criterion's clause 1 would have held at a true {_signed(MARGIN, 2)} only "
                 f"{pw['at_margin']:.2f} of the time")
    return text + "."


def reading_lines(data: dict) -> list[str]:
    """After the answer: the reading in one paragraph, then its parts, each computed from study.json."""
    f = facts(data)
    if f is None:
        return []
    parts = [power_text(f), clause5_text(f), lambda_text(f), share_text(f), interval_text(f), starts_text(f)]
    return [summary_text(f), "", *[f"- {p}" for p in parts if p], ""]


def answer_lines(a: dict | None, devs: Sequence[dict]) -> list[str]:
    """The answer, first: the primary's d̄ with its interval and positive seeds, each clause's verdict, whether another
    form passes clauses 1, 2, 4 and 5, and the count of the deviations listed at the end of the section."""
    if not a or a.get("answer") is None or a.get("primary") is None:
        return []
    p = a[a["primary"]]
    clauses = [c for c in ("1", "2", "3", "4", "5") if c in p["clauses"]]
    verdicts = []
    for verdict, holds in (("fail", False), ("hold", True)):
        group = [c for c in clauses if p["clauses"][c] == holds]
        if group:
            verdicts.append(f"clause {group[0]} {verdict}s" if len(group) == 1 else
                            f"clauses {', '.join(group[:-1])} and {group[-1]} {verdict}")
    others = [arm for arm in FORMS if arm != a["primary"] and all(a[arm]["clauses"][c] for c in "1245")]
    said = (f" {len(devs)} deviations are recorded, listed at the end of this section (the protocol, 'Deviations', "
            "lists them before the verdicts: here the answer comes first)." if devs else " No deviation is recorded.")
    return [f"**The answer: {a['answer']}.** The primary arm `{a['primary']}` against GRPO at seeds "
            f"{SEEDS[0]}–{SEEDS[-1]}: d̄ {_signed(p['mean'])} {_ci(p['ci95'])}, positive at {p['positive']} of "
            f"{p['seeds']} seeds; {', '.join(verdicts)} ('The criterion' below). "
            + ("Passing clauses 1, 2, 4 and 5 besides it: " + ", ".join(f"`{o}`" for o in others) + "."
               if others else "No other form passes clauses 1, 2, 4 and 5.") + said, ""]
