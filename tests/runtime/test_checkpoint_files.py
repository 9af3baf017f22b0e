"""A checkpoint's manifest (sizes and sha256 of its files), its verification, and the failures of a write: an OS
error from the real OS (a file-size limit in a child process, no root needed) names the path and leaves the previous
checkpoint as the newest, with no partial folder."""

import hashlib
import json
import subprocess
import sys
import textwrap

import pytest
import torch

from seedfast.runtime.checkpoint import latest_checkpoint, load_checkpoint, resume_latest, save_checkpoint
from seedfast.runtime.checkpoint_files import CheckpointError, verify_files


def _model_and_opt():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Linear(64, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(2, 16)).sum().backward()
    opt.step()
    return model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)


def test_the_manifest_holds_every_files_size_and_sha256(tmp_path):
    model, opt, sched = _model_and_opt()
    path = save_checkpoint(tmp_path, 1, model, opt, sched, {}, config_yaml="algorithm: grpo\n")
    files = json.loads((path / "manifest.json").read_text())["files"]
    on_disk = {p.name for p in path.iterdir()} - {"manifest.json", "COMPLETE"}
    assert set(files) == on_disk == {"model.safetensors", "state.pt", "trainer_state.json", "config.yaml"}
    for name, entry in files.items():  # against hashlib reading the file, independently of the writer
        data = (path / name).read_bytes()
        assert entry == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert verify_files(path) == []


def test_a_file_garbled_in_place_is_found_by_its_hash_and_named(tmp_path):
    model, opt, sched = _model_and_opt()
    for step in (1, 2):
        save_checkpoint(tmp_path, step, model, opt, sched, {})
    state = tmp_path / "step_2" / "state.pt"
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one byte: same size
    state.write_bytes(bytes(data))
    assert verify_files(tmp_path / "step_2", hashes=False) == []  # the size alone cannot tell
    [problem] = verify_files(tmp_path / "step_2")
    assert problem == f"{state}: sha256 differs from the manifest's (the file is damaged)"
    shares = [verify_files(tmp_path / "step_2", share=(i, 3)) for i in range(3)]  # three ranks split the files
    assert sorted(p for s in shares for p in s) == [problem]
    with pytest.raises(CheckpointError, match="step_2 is damaged: .*state.pt: sha256 differs"):
        load_checkpoint(tmp_path / "step_2", model, opt, sched)
    with pytest.warns(UserWarning, match="step_2 is damaged"):
        path, state_dict = resume_latest(tmp_path, model, opt, sched)
    assert path.name == "step_1" and state_dict["step"] == 1


def test_a_file_size_limit_mid_write_names_the_path_and_keeps_the_previous_checkpoint(tmp_path):
    """RLIMIT_FSIZE in a child process: the real EFBIG of the OS, as a full disk's ENOSPC would come."""
    script = textwrap.dedent(f"""
        import resource, signal, torch
        from seedfast.runtime.checkpoint import save_checkpoint
        from seedfast.runtime.checkpoint_files import CheckpointWriteError
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Linear(256, 64))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        model(torch.randn(2, 64)).sum().backward()
        opt.step()
        save_checkpoint({str(tmp_path)!r}, 1, model, opt, None, {{}})
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, resource.RLIM_INFINITY))
        try:
            save_checkpoint({str(tmp_path)!r}, 2, model, opt, None, {{}})
        except CheckpointWriteError as err:
            print("ERROR", err.errno, err)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip().splitlines()[-1]
    assert line.startswith("ERROR 27 [Errno 27] File too large: writing ") and f"{tmp_path}/.step_2.tmp/" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_1"]  # no partial .step_2.tmp
    assert latest_checkpoint(tmp_path).name == "step_1" and verify_files(tmp_path / "step_1") == []


def test_a_full_disk_seen_only_when_a_file_is_closed_is_named_too(tmp_path, monkeypatch):
    """A buffered file may report ENOSPC only at its last flush, on close (found on a real 20 MB tmpfs)."""
    import errno
    import io

    from seedfast.runtime import checkpoint_files

    class FullAtClose(io.BufferedWriter):
        def close(self):
            if not self.closed and str(self.name).endswith("state.pt"):
                super().close()
                raise OSError(errno.ENOSPC, "No space left on device")
            super().close()

    def opener(path, mode="r", *args, **kwargs):
        if mode == "wb":
            return FullAtClose(io.FileIO(path, "w"))
        return open(path, mode, *args, **kwargs)

    model, opt, sched = _model_and_opt()
    save_checkpoint(tmp_path, 1, model, opt, sched, {})
    monkeypatch.setattr(checkpoint_files, "open", opener, raising=False)
    with pytest.raises(checkpoint_files.CheckpointWriteError,
                       match=rf"\[Errno 28\] no space left on device: writing {tmp_path}/.step_2.tmp/state.pt$"):
        save_checkpoint(tmp_path, 2, model, opt, sched, {})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_1"]
