"""The files of a checkpoint folder: written with their size and sha256 recorded, checked before a resume trusts them.

A checkpoint's `manifest.json` lists every file it holds with its size in bytes and its sha256, and is written
before the COMPLETE marker (docs/reference.md, 'Checkpoints and resume'). The hashes cost no extra read where a file
is written through `HashingWriter` (torch.save's states); the safetensors file is hashed by reading it back from the
page cache right after it is written. `verify_files` checks sizes always (a truncated file, the usual damage of a
full disk or a killed copy) and hashes unless asked not to (a file garbled in place keeps its size).

A write error becomes a `CheckpointWriteError` naming the file and the OS's reason ("No space left on device"),
whatever library wrote the file: torch's zip writer reports a failed write only as "unexpected pos", so the OS
error is caught where the bytes pass (`HashingWriter`), and safetensors' "(os error N)" is read back into errno N.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, BinaryIO

MANIFEST = "manifest.json"
_CHUNK = 8 << 20


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: missing, incomplete, damaged or unreadable (the message names the file)."""


class CheckpointWriteError(OSError):
    """Writing a checkpoint failed (no space left, a file-size limit, any OS error): the message names the path;
    the partial folder is already removed."""


class HashingWriter:
    """A binary file that counts and hashes what is written through it, and keeps the OSError of a failed write
    (torch.save reports it only as a bare RuntimeError)."""

    def __init__(self, handle: BinaryIO) -> None:
        self.handle = handle
        self.size = 0
        self.sha256 = hashlib.sha256()
        self.error: OSError | None = None
        self.interrupt: BaseException | None = None  # KeyboardInterrupt, a stop signal: raised again as it was

    def write(self, data: bytes) -> int:
        try:
            written = self.handle.write(data)
        except OSError as err:
            self.error = err
            raise
        except BaseException as stop:  # a signal handler's exception: torch would turn it into a RuntimeError
            self.interrupt = stop
            raise
        self.sha256.update(memoryview(data)[:written])
        self.size += written
        return written

    def flush(self) -> None:
        self.handle.flush()


def file_digest(path: Path) -> tuple[int, str]:
    """(size, sha256 hex) of the file `path`, read in chunks."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def _interrupt_behind(err: BaseException) -> BaseException | None:
    """A KeyboardInterrupt or stop signal that torch.save turned into its RuntimeError (the signal's exception is
    the error's context): it must stop the run as the signal, not count as a failed write."""
    seen = err.__context__
    while seen is not None:
        if not isinstance(seen, Exception):
            return seen
        seen = seen.__context__
    return None


def _os_error_of(err: BaseException, path: Path) -> OSError | None:
    """The OS error behind a failed write, however the writing library reported it."""
    if isinstance(err, OSError):
        return err
    match = re.search(r"os error (\d+)", str(err))  # safetensors (Rust): "I/O error: File too large (os error 27)"
    if match:
        code = int(match.group(1))
        return OSError(code, os.strerror(code), str(path))
    return None


class CheckpointWriter:
    """Writes the files of one checkpoint folder, records each file's size and sha256, and turns any failure into
    an error naming the file (an OS error: `CheckpointWriteError`)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.files: dict[str, dict[str, Any]] = {}

    def stream(self, name: str, write: Callable[[HashingWriter], None]) -> None:
        """Write the file `name` through `write(handle)`, hashed as the bytes pass (torch.save)."""
        path = self.folder / name
        sink: HashingWriter | None = None
        try:
            with open(path, "wb") as f:  # closed inside the try: a full disk may show only at the last flush
                sink = HashingWriter(f)
                write(sink)
                f.flush()
                os.fsync(f.fileno())
        except Exception as err:
            stop = (sink.interrupt if sink is not None else None) or _interrupt_behind(err)
            if stop is not None:
                raise stop from None
            raise self._failed(path, (sink.error if sink is not None else None) or err) from err
        self.files[name] = {"size": sink.size, "sha256": sink.sha256.hexdigest()}

    def file(self, name: str, write: Callable[[Path], None]) -> None:
        """Write the file `name` through `write(path)` (a library that opens the path itself: safetensors), then
        hash it from the page cache."""
        path = self.folder / name
        try:
            write(path)
            with open(path, "rb") as f:
                os.fsync(f.fileno())
        except Exception as err:
            raise self._failed(path, err) from err
        size, sha = file_digest(path)
        self.files[name] = {"size": size, "sha256": sha}

    def text(self, name: str, text: str) -> None:
        self.stream(name, lambda f: f.write(text.encode()))

    def add_existing(self, names: Iterable[str]) -> None:
        """Record files another writer put in the folder (DCP's shards)."""
        for name in names:
            size, sha = file_digest(self.folder / name)
            self.files[name] = {"size": size, "sha256": sha}

    def write_manifest(self) -> None:
        self.text(MANIFEST, json.dumps({"version": 1, "files": dict(sorted(self.files.items()))}, indent=1))

    def _failed(self, path: Path, err: BaseException) -> Exception:
        os_error = _os_error_of(err, path)
        if os_error is not None:
            reason = os_error.strerror or str(os_error)
            if os_error.errno == errno.ENOSPC:
                reason = "no space left on device"
            return CheckpointWriteError(os_error.errno or errno.EIO, f"{reason}: writing {path}")
        return CheckpointError(f"writing {path} failed: {type(err).__name__}: {err}")


def read_manifest(folder: Path) -> dict[str, dict[str, Any]] | None:
    """The files a checkpoint's manifest lists, or None for a checkpoint written before manifests."""
    path = folder / MANIFEST
    if not path.exists():
        return None
    try:
        files = json.loads(path.read_text())["files"]
        if not isinstance(files, dict):
            raise TypeError("'files' is not a mapping")
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"{path}: unreadable manifest ({type(err).__name__}: {err})") from None
    return files


def verify_files(folder: Path, hashes: bool = True, share: tuple[int, int] = (0, 1)) -> list[str]:
    """What is wrong with the files of the checkpoint `folder` against its manifest, one line per file (empty when
    all is well; a checkpoint without a manifest is not checked here: its load will tell). `share` = (i, n): check
    only every n-th file from the i-th (the ranks of a sharded run split the reading)."""
    try:
        files = read_manifest(folder)
    except CheckpointError as err:
        return [str(err)]
    if files is None:
        return []
    problems = []
    index, count = share
    for i, (name, want) in enumerate(sorted(files.items())):
        if i % count != index:
            continue
        path = folder / name
        if not path.is_file():
            problems.append(f"{path}: missing")
            continue
        size = path.stat().st_size
        if size != want["size"]:
            problems.append(f"{path}: {size} bytes, the manifest says {want['size']} (truncated or replaced)")
        elif hashes and file_digest(path)[1] != want["sha256"]:
            problems.append(f"{path}: sha256 differs from the manifest's (the file is damaged)")
    return problems


def tree_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def check_free_space(folder: Path, needed: int) -> None:
    """A `CheckpointWriteError` naming `folder`, the bytes needed and the bytes free when the disk cannot hold
    `needed` more bytes: said before anything is written."""
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise CheckpointWriteError(errno.ENOSPC, f"no space left on device for a checkpoint in {folder}: it needs "
                                                 f"about {needed:,} bytes, {free:,} are free")


def remove_stale_temporaries(ckpt_dir: Path) -> list[Path]:
    """Remove the `.step_<n>.tmp` folders a killed run left behind (never a complete checkpoint); returns them."""
    if not ckpt_dir.is_dir():
        return []
    stale = [p for p in ckpt_dir.iterdir() if p.name.startswith(".step_") and p.name.endswith(".tmp")]
    for p in stale:
        shutil.rmtree(p, ignore_errors=True)
    return stale
