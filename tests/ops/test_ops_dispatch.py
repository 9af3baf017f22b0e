"""Backend selection: explicit argument, environment override, device."""

import pytest
import torch

from seedfast.ops import chunked, dispatch, get_backend


def test_torch_backend_is_the_chunked_module(monkeypatch):
    monkeypatch.delenv(dispatch.BACKEND_ENV, raising=False)
    assert get_backend("torch", "cpu") is chunked
    assert get_backend("auto", "cpu") is chunked
    for name in ("forward", "backward", "token_loss", "fused_forward_backward"):
        assert callable(getattr(chunked, name))


def test_resolution(monkeypatch):
    monkeypatch.delenv(dispatch.BACKEND_ENV, raising=False)
    assert dispatch.resolve_backend_name("auto", torch.device("cpu")) == "torch"
    assert dispatch.resolve_backend_name("auto", torch.device("cuda")) == "triton"
    monkeypatch.setenv(dispatch.BACKEND_ENV, "torch")
    assert dispatch.resolve_backend_name("auto", torch.device("cuda")) == "torch"
    assert dispatch.resolve_backend_name("triton", torch.device("cuda")) == "triton"  # the argument wins
    monkeypatch.setenv(dispatch.BACKEND_ENV, "triton")
    assert dispatch.resolve_backend_name("auto", torch.device("cpu")) == "triton"
    assert dispatch.resolve_backend_name("torch", torch.device("cpu")) == "torch"


def test_forced_triton_on_cpu_needs_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv(dispatch.BACKEND_ENV, "triton")
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        get_backend("auto", "cpu")


def test_forced_triton_that_does_not_import_is_an_error(monkeypatch):
    def missing():
        raise ImportError("no module named seedfast.ops.triton_backend")

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(dispatch, "_triton_module", missing)
    with pytest.raises(ValueError, match="not available"):
        get_backend("triton", "cpu")


def test_auto_on_cuda_falls_back_to_torch_when_triton_does_not_import(monkeypatch):
    def missing():
        raise ImportError("no triton")

    monkeypatch.delenv(dispatch.BACKEND_ENV, raising=False)
    monkeypatch.setattr(dispatch, "_triton_module", missing)
    monkeypatch.setattr(dispatch, "_warned_fallback", False)
    with pytest.warns(RuntimeWarning, match="torch backend"):
        assert get_backend("auto", "cuda") is chunked


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_auto_on_cuda_picks_triton():
    import importlib

    assert get_backend("auto", "cuda") is importlib.import_module("seedfast.ops.triton_backend")
