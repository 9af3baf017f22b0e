"""One session's share of the study (#47): the study's subcommands run at the study commit, and every record lands
on main the moment it is written (docs/study.md, 'Sessions').

    python -m experiments.study_session --until 13:30                      # the selection, then seeds 5, 6, ...
    python -m experiments.study_session --until 13:30 --bundles 7 8 --lanes 2

A session's machine goes back when the session ends, with its runs/ folder and any worktree, and the next one may
have another kind of CPU. So the study runs in bundles: a bundle is one seed made whole on one CPU, its SFT start,
its teacher gap on the decided pool and its runs (`select`: seed 11's start, gap and the λ-selection runs; a seed of
5-10: its start, gap and the seven arms, after the whole selection). Jobs run in `--lanes` processes side by side
(one torch thread each, as the protocol allows), in the plan's order; a job starts only if its estimate fits before
`--until`, so no run is cut off by the session's end. After each job the worktree's study.json is copied to main
with its generated docs section and committed (those two files only).

A start made again is fingerprinted (the SHA-256 of its weights). A seed whose lost start has no fingerprint, or
another one, keeps nothing made from it: its gap on the pool, its held-out evaluation and its runs move to
study.json's `superseded` with a deviation, and the bundle makes them again. Where the CPU is not the study's first,
each subcommand runs with `--deviation`, which the study records.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import machine_info
from experiments import study

ROOT = Path(__file__).resolve().parents[1]
# one-thread seconds per job ('Compute budget and the order of runs' in docs/study.md)
COST_S = {"games": 120.0, "start": 330.0, "gap": 240.0, "control": 72.0, "grpo": 277.0, "gate": 246.0,
          "advantage": 246.0, "shuffled": 246.0, "reverse_kl": 353.0, "self": 892.0}
SLACK = 1.5  # a job starts only if 1.5x its estimate fits before --until: the box's load moves run times
RULE = "docs/study.md, 'Sessions'"
RESULT_IN_TREE = Path("experiments") / "results" / "study.json"


@dataclass
class Job:
    name: str
    seed: int | None
    argv: list[str]  # a study subcommand with its arguments; `games` runs `seedfast envs make` instead
    cost_s: float
    after: tuple[str, ...] = ()
    state: str = "waiting"  # waiting | running | done | failed | skipped


def candidate_names() -> list[tuple[str, str]]:
    """(name for `select --only`, arm) of seed 11's runs, in the study's order."""
    return [(key.rsplit("/", 1)[1].replace("_lam", "/"), arm) for key, arm, _ in study.selection_keys()]


def bundle_jobs(bundle: str, pool: str) -> list[Job]:
    """One bundle's jobs in order: the seed's start, its gap on the pool, then its runs."""
    if bundle != "select" and (not bundle.isdigit() or int(bundle) not in study.SEEDS):
        raise SystemExit(f"--bundles {bundle}: a bundle is 'select' or one of the study's seeds {study.SEEDS}")
    seed = study.SELECT_SEED if bundle == "select" else int(bundle)
    start, gap = f"start s{seed}", f"gap s{seed}"
    jobs = [Job(start, seed, ["starts", "--seeds", str(seed)], COST_S["start"], ("games",)),
            Job(gap, seed, ["gap", "--seeds", str(seed), "--pool", pool], COST_S["gap"], (start,))]
    if bundle == "select":
        return jobs + [Job(f"select {name}", seed, ["select", "--only", name], COST_S[arm], (gap,))
                       for name, arm in candidate_names()]
    selection = tuple(f"select {name}" for name, _ in candidate_names())
    return jobs + [Job(f"run s{seed} {arm}", seed, ["run", "--seeds", str(seed), "--arms", arm], COST_S[arm],
                       (gap, *selection)) for arm in study.ARMS]


def plan(bundles: Sequence[str], pool: str, selection_done: bool) -> list[Job]:
    """The games, then every bundle's jobs. A run waits for the whole selection: for its jobs when the selection is
    a bundle of this session, for nothing when study.json already holds it; else no run can start."""
    jobs = [Job("games", None, [], COST_S["games"])] + [j for b in bundles for j in bundle_jobs(b, pool)]
    names = {j.name for j in jobs}
    for j in jobs:
        j.after = tuple(a for a in j.after if a in names or not (a.startswith("select ") and selection_done))
    return jobs


def chain_cost_s(job: Job, by_name: dict[str, Job]) -> float:
    """The job's estimate plus the longest chain of its waiting dependencies': what must still start before it can."""
    waiting = [by_name[a] for a in job.after if a in by_name and by_name[a].state == "waiting"]
    return job.cost_s + max((chain_cost_s(d, by_name) for d in waiting), default=0.0)


def next_job(jobs: list[Job], now: float, until: float) -> Job | None | str:
    """The first waiting job whose dependencies are done and whose estimate fits; "wait" when one could start
    after a running job ends (its waiting dependencies fitting before `until` too); None when nothing more can
    start. Jobs behind a failed or skipped one are skipped."""
    by_name = {j.name: j for j in jobs}
    could_wait = False
    for j in jobs:
        if j.state != "waiting":
            continue
        deps = [by_name[a] for a in j.after if a in by_name]
        if any(d.state in ("failed", "skipped") for d in deps) or any(a not in by_name for a in j.after):
            j.state = "skipped"
            continue
        if now + SLACK * chain_cost_s(j, by_name) > until:
            continue
        if all(d.state == "done" for d in deps):
            return j
        could_wait = could_wait or all(d.state in ("done", "running", "waiting") for d in deps)
    return "wait" if could_wait else None


def weights_sha256(policy_dir: Path) -> str:
    digest = hashlib.sha256()
    with open(policy_dir / "model.safetensors", "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def supersede(data: dict, seed: int, pool: str, lost_start: dict, why: str) -> list[str]:
    """Move what was made from seed `seed`'s lost start (its gap on `pool`, held-out evaluation, runs, and at seed 11
    the selection) to data['superseded'], with a deviation; the names of what moved."""
    moved: dict = {"seed": seed, "lost_start": lost_start, "why": why,
                   "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    names = []
    if f"{pool}/s{seed}" in data["teacher_gap"]:
        moved["teacher_gap"] = data["teacher_gap"].pop(f"{pool}/s{seed}")
        names.append(f"its teacher gap on {pool}")
    start = data["starts"].get(f"sparse/s{seed}", {})
    heldout = {k: start.pop(k) for k in ("pool", *study.HELDOUT_KEYS) if k in start}
    if heldout:
        moved["heldout"] = heldout
        names.append("its held-out evaluation")
    prefix = f"select/s{seed}/" if seed == study.SELECT_SEED else f"sparse/s{seed}/"
    moved["runs"] = {k: data["runs"].pop(k) for k in [k for k in data["runs"] if k.startswith(prefix)]}
    if moved["runs"]:
        names.append(f"{len(moved['runs'])} runs")
    if seed == study.SELECT_SEED and data.get("selection") is not None:
        moved["selection"], data["selection"] = data["selection"], None
        names.append("the selection")
    data.setdefault("superseded", []).append(moved)
    study.deviation(data, f"seed {seed} made whole again from a new start ({', '.join(names) or 'nothing more'} "
                          "moved to superseded)", why)
    return names


def fingerprint_start(result: Path, policy: Path, seed: int, pool: str, lost: dict | None, cpu: str) -> str:
    """Record the start's fingerprint; where the lost start's is missing or differs, supersede what it made."""
    sha = weights_sha256(policy)
    with study.locked(result) as data:
        data["starts"].setdefault(f"sparse/s{seed}", {}).setdefault("sft", {})["weights_sha256"] = sha
        lost_sha = (lost or {}).get("weights_sha256")
        if lost is None or lost_sha == sha:
            return f"start s{seed} {sha[:12]}" + (", the lost start's weights" if lost else "")
        why = (f"{RULE}: the start made on {(lost.get('machine') or {}).get('cpu')} went with its session's machine, "
               + ("with no fingerprint recorded" if lost_sha is None else f"fingerprint {lost_sha[:12]}, the new "
                  f"one is {sha[:12]}") + f"; the seed is made whole again on {cpu}")
        names = supersede(data, seed, pool, lost, why)
    return f"start s{seed} {sha[:12]}: superseded {', '.join(names) or 'nothing'}"


def games_argv(*overrides: str) -> list[str]:
    """`seedfast envs make` for the starts' games (the SFT recipe's, 'The SFT starts'), or with `overrides` after
    them, another set of the same folder (the pool's)."""
    return [sys.executable, "-m", "seedfast", "envs", "make", study.CONFIG, "env.games_dir=runs/sparse/games",
            "env.n_eval=32", *overrides]


def regenerate_docs() -> None:
    """`make docs` on main: the study's "Result" section follows the copied study.json."""
    subprocess.run([sys.executable, "-m", "docs.generate"], cwd=ROOT, check=True, capture_output=True)


class Session:
    def __init__(self, worktree: Path, until: float, lanes: int, commit: bool = True,
                 log: Callable[[str], None] = print) -> None:
        self.worktree, self.until, self.lanes, self.commit, self.log = worktree, until, lanes, commit, log
        self.result = worktree / RESULT_IN_TREE
        self.land_lock = threading.Lock()
        self.cpu = machine_info().get("cpu")
        self.logs = ROOT / "runs" / "study_session"

    def prepare(self) -> dict:
        """The worktree at the study commit, holding main's study.json."""
        data = study.load()
        commit = data.get("study_commit")
        if not commit:
            raise SystemExit("study_session: study.json names no study commit")
        if not self.worktree.exists():
            subprocess.run(["git", "worktree", "add", "--detach", str(self.worktree), commit], cwd=ROOT, check=True)
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=self.worktree, capture_output=True, text=True,
                              check=True).stdout.strip()
        if head != commit:
            raise SystemExit(f"study_session: {self.worktree} is at {head}, the study commit is {commit}")
        self.result.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(study.RESULT, self.result)
        self.logs.mkdir(parents=True, exist_ok=True)
        return data

    def argv(self, job: Job, data: dict) -> list[str]:
        python = [sys.executable, "-m"]
        if job.name == "games":
            return games_argv()
        deviation = []
        if job.seed is not None and self.cpu != (data.get("machine") or {}).get("cpu"):
            deviation = ["--deviation", f"{RULE}: seed {job.seed} made whole on {self.cpu}, the study's first "
                                        f"runs on {(data.get('machine') or {}).get('cpu')}"]
        return [*python, "experiments.study", *job.argv, *deviation]

    def run(self, job: Job, data: dict) -> None:
        lost = study.load(self.result)["starts"].get(f"sparse/s{job.seed}", {}).get("sft")
        env = {**os.environ, "PYTHONPATH": str(self.worktree), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        commands = [self.argv(job, data)]
        if job.name == "games":  # the pool's games as well, before any lane's gap or run would make them at once
            commands.append(games_argv(*study.AS_STUDIED, *data["pool"]["overrides"]))
        with open(self.logs / f"{job.name.replace(' ', '_').replace('/', '_')}.log", "a") as out:
            for argv in commands:
                subprocess.run(argv, cwd=self.worktree, env=env, stdout=out, stderr=subprocess.STDOUT, check=True)
        what = job.name
        if job.argv[:1] == ["starts"]:
            policy = self.worktree / "runs" / f"sparse_sft_s{job.seed}" / "sft"
            what = fingerprint_start(self.result, policy, job.seed, data["pool"]["name"], lost, self.cpu)
        self.land(what)

    def land(self, what: str) -> None:
        """main's study.json := the worktree's, its docs section regenerated, both committed."""
        with self.land_lock:
            with study.locked(self.result) as data:
                pass
            study.write_json_atomic(study.RESULT, data)
            regenerate_docs()
            if self.commit:
                message = f"#47 study at {study.load()['study_commit'][:7]}, on {self.cpu}: {what}"
                for _ in range(5):  # another commit on main may hold git's index lock for a moment
                    done = subprocess.run(["git", "commit", "-q", "-m", message, "--", str(study.RESULT),
                                           study.PROTOCOL], cwd=ROOT, capture_output=True, text=True)
                    if done.returncode == 0 or "nothing to commit" in done.stdout + done.stderr:
                        break
                    time.sleep(2)
            self.log(f"landed: {what}")

    def go(self, jobs: list[Job], data: dict) -> list[Job]:
        state = threading.Condition()

        def lane() -> None:
            while True:
                with state:
                    job = next_job(jobs, time.time(), self.until)
                    while job == "wait":
                        state.wait(timeout=30)
                        job = next_job(jobs, time.time(), self.until)
                    if job is None:
                        state.notify_all()
                        return
                    job.state = "running"
                self.log(f"{datetime.datetime.now():%H:%M} start {job.name}")
                try:
                    self.run(job, data)
                    outcome = "done"
                except (subprocess.CalledProcessError, OSError) as error:
                    self.log(f"{job.name} failed: {error} (its log in {self.logs})")
                    outcome = "failed"
                with state:
                    job.state = outcome
                    state.notify_all()

        threads = [threading.Thread(target=lane, name=f"lane{i}") for i in range(self.lanes)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return jobs


def clock_until(text: str) -> float:
    """HH:MM today (local time) as a timestamp."""
    try:
        hours, minutes = (int(x) for x in text.split(":"))
        return datetime.datetime.now().replace(hour=hours, minute=minutes, second=0, microsecond=0).timestamp()
    except ValueError:
        raise argparse.ArgumentTypeError(f"--until {text!r}: give the hour as HH:MM, e.g. 16:35") from None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--until", required=True, type=clock_until,
                   help="HH:MM: no job starts that would not end before it")
    p.add_argument("--bundles", nargs="+", default=["select", *map(str, study.SEEDS)])
    p.add_argument("--lanes", type=int, default=2)
    p.add_argument("--worktree", type=Path, default=ROOT.parent / "study")
    p.add_argument("--no-commit", action="store_true", help="copy the records to main without committing them")
    args = p.parse_args(argv)
    session = Session(args.worktree, args.until, args.lanes, commit=not args.no_commit)
    data = session.prepare()
    if data.get("pool") is None:
        raise SystemExit("study_session: no pool decided yet (the study's gap and pool subcommands first)")
    jobs = plan(args.bundles, data["pool"]["name"], data.get("selection") is not None)
    session.go(jobs, data)
    for j in jobs:
        print(f"{j.state:8s} {j.name}")
    return 0 if all(j.state in ("done", "waiting") for j in jobs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
