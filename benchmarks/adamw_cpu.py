"""One AdamW step: torch's default implementation vs its fused one (what seedfast's optimizers use, sft/loop.py
`adamw`), time and peak memory above the moments, each in a fresh process.

    python -m benchmarks.adamw_cpu            # Qwen2.5-0.5B-sized embedding + six MLP matrices (166M fp32 params)
"""

from __future__ import annotations

import argparse
import json
import time

from benchmarks.common import PeakRSS, print_table, run_worker, write_results

SHAPES = [(151936, 896)] + [(896, 4864)] * 6


def worker(variant: str) -> dict:
    import torch

    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(*shape)) for shape in SHAPES]
    for p in params:
        p.grad = torch.randn_like(p)
    optimizer = torch.optim.AdamW(params, lr=1e-6, fused=variant == "fused")
    for p in params:  # the moments exist already, as in every step after the first
        optimizer.state[p].update(step=torch.tensor(0.0), exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
    with PeakRSS() as peak:
        start = time.perf_counter()
        optimizer.step()
        seconds = time.perf_counter() - start
    return {"variant": variant, "seconds": seconds, "peak_extra_mib": peak.extra_bytes / 2**20,
            "memory_method": peak.method, "params": sum(p.numel() for p in params)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", choices=("default", "fused"))
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker)))
        return
    rows = [run_worker(["-m", __spec__.name, "--worker", v]) for v in ("default", "fused")]
    for row in rows:
        row["time_vs_default"] = row["seconds"] / rows[0]["seconds"]
    print_table(rows, ["variant", "seconds", "peak_extra_mib", "time_vs_default"], "one AdamW step on CPU")
    write_results("adamw_cpu", {"shapes": SHAPES, "results": rows})


if __name__ == "__main__":
    main()
