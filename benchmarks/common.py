"""Helpers shared by the benchmarks: machine and version info, JSON results, tables, timing, peak memory
of a fresh process.

A benchmark prints a table and writes benchmarks/results/<name>.json holding the machine it ran on,
the versions, the shapes and the measurements (docs/performance.md, 'Benchmarks'); one whose file holds several
runs (logprob_cpu's thread counts, kernel_report's Triton versions, rollout's profile) rewrites only its own entry.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = Path(__file__).resolve().parent / "results"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict:
    """CPU model, cores, memory, GPU (if any), load average, OS and Python: where the numbers come from."""
    info = {
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }
    try:
        info["mem_total_gib"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
        info["loadavg_1_5_15"] = list(os.getloadavg())
    except (OSError, ValueError, AttributeError):
        pass
    try:
        import torch

        info["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
            info["gpu_count"] = torch.cuda.device_count()
    except ImportError:
        pass
    return info


def versions(*packages: str) -> dict[str, str | None]:
    """Installed versions of the given distributions (None when absent)."""
    found = {}
    for name in packages:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def command_line() -> str:
    """How this process was started, as a user would type it: `python -m benchmarks.step --reps 7`."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    script = ["-m", spec.name] if spec is not None else sys.argv[:1]
    return " ".join([Path(sys.executable).name, *script, *sys.argv[1:]])


def results_record(name: str, payload: dict, packages: Sequence[str] = ("torch", "triton", "seedfast")) -> dict:
    """The payload plus the benchmark's name, date, command line, commit, machine and versions: one run's record."""
    return {
        "benchmark": name,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command_line(),
        "git_commit": git_commit(),
        "machine": machine_info(),
        "versions": versions(*packages),
        **payload,
    }


def write_results(name: str, payload: dict, packages: Sequence[str] = ("torch", "triton", "seedfast"),
                  directory: Path = RESULTS_DIR) -> Path:
    """Write <directory>/<name>.json (default: results/, the committed one) with the payload plus machine, versions,
    commit, date and command line. A test that runs a benchmark writes elsewhere: the committed file is the
    benchmark's run, not a test's."""
    return write_json_atomic(Path(directory) / f"{name}.json", results_record(name, payload, packages))


def update_json_atomic(path: Path, keys: Sequence[str], value: object, base: dict) -> Path:
    """Set `value` at `keys` (nested dict keys, made where missing) in the JSON at `path`, or in `base` when there is
    no file yet, and write it back atomically: a benchmark whose one file holds several runs (one per thread count,
    per Triton version, ...) replaces its own entry and keeps the others."""
    path = Path(path)
    record = json.loads(path.read_text(encoding="utf-8")) if path.exists() else base
    node = record
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    node[keys[-1]] = value
    return write_json_atomic(path, record)


def write_json_atomic(path: Path, payload: dict) -> Path:
    """Write JSON to a temporary file beside `path`, then rename it into place: a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    os.replace(tmp, path)
    return path


def print_table(rows: Sequence[dict], columns: Sequence[str], title: str | None = None) -> None:
    """Plain-text table (rich is not needed to read a benchmark log)."""
    def cell(value: object) -> str:
        if isinstance(value, float):
            return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
        return "" if value is None else str(value)

    table = [[cell(row.get(col)) for col in columns] for row in rows]
    widths = [max(len(col), *(len(r[i]) for r in table)) for i, col in enumerate(columns)]
    if title:
        print(title)
    print("  ".join(col.ljust(w) for col, w in zip(columns, widths)))
    print("  ".join("-" * w for w in widths))
    for r in table:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths)))


def time_reps(fn: Callable[[], object], reps: int, warmup: int = 1) -> list[float]:
    """Wall seconds of `reps` calls after `warmup` calls (fn must finish its own device work)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


class PeakRSS:
    """Peak resident memory above the level at entry, for this process (Linux).

    Resets the kernel's high-water mark (VmHWM) through /proc/self/clear_refs at entry, so that the
    peak seen at exit belongs to the block. Measures everything the process touches (torch's CPU
    allocator included), which tracemalloc cannot. Run each variant in a fresh process: memory that
    an allocator kept from earlier work would hide part of the next peak.
    """

    def __enter__(self) -> PeakRSS:
        self.method = "VmHWM after clear_refs"
        try:
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            self.method = "ru_maxrss (peak since process start)"
        self.baseline = _status_bytes("VmRSS")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.method.startswith("VmHWM"):
            peak = _status_bytes("VmHWM")
        else:
            import resource

            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        self.extra_bytes = max(0, peak - self.baseline)


def _status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not found in /proc/self/status")


def run_worker(argv: Sequence[str], timeout: float = 1800, env: dict | None = None) -> dict:
    """Run `python argv...` (`-m benchmarks.NAME ...`) from the repository's root in a fresh process; its last stdout
    line must be a JSON object."""
    proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        raise RuntimeError(f"worker {' '.join(argv)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def wrap_paragraph(paragraph: str, width: int = 116) -> str:
    """A prose paragraph of a generated docs section wrapped at `width` (tables and headings as they are)."""
    if paragraph.startswith(("|", "#")) or not paragraph:
        return paragraph.rstrip("\n")
    return textwrap.fill(paragraph, width=width, break_long_words=False, break_on_hyphens=False)
