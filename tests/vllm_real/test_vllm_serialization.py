"""The weight payloads seedfast sends to vLLM's worker pass vLLM's own message serializer as it is configured by
default (VLLM_ALLOW_INSECURE_SERIALIZATION unset): the serializer `collective_rpc` puts a utility call through on its
way to the engine core process. The GPU path's CUDA IPC handle (rebuild function + arguments) used to be sent as is,
which that serializer refuses ('Object of type <class 'function'> is not serializable'); a CPU tensor came out as
lists. Both now travel as bytes the worker extension unpacks. Real vLLM (the tier's venv); skipped without it."""

from __future__ import annotations

import pytest
import torch

vllm = pytest.importorskip("vllm")
serial_utils = pytest.importorskip("vllm.v1.serial_utils")

from seedfast.rollout import vllm_engine  # noqa: E402


@pytest.fixture(autouse=True)
def default_serializer(monkeypatch):
    """vLLM's serializer as seedfast runs it: never with the insecure fallback to pickle."""
    monkeypatch.delenv("VLLM_ALLOW_INSECURE_SERIALIZATION", raising=False)


def _through_vllm(method: str, args: tuple):
    """A utility call (collective_rpc's) encoded by vLLM's client encoder and decoded as the engine core does."""
    call = (0, 1, "collective_rpc", (method, None, args, {}))
    frames = serial_utils.MsgpackEncoder().encode(call)
    return serial_utils.MsgpackDecoder().decode(frames)[3][2]


def _cuda_reduce(tensor: torch.Tensor):
    """What torch's reduce_tensor returns for a CUDA tensor (torch/multiprocessing/reductions.py): the rebuild
    function and its 15 arguments, with a made-up handle where no GPU is; on a GPU the real one."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor, reduce_tensor

    if torch.cuda.is_available():
        return reduce_tensor(tensor.cuda())
    storage_bytes = tensor.numel() * tensor.element_size()
    return rebuild_cuda_tensor, (type(tensor), tensor.shape, tensor.stride(), 0, torch.storage.UntypedStorage,
                                 tensor.dtype, 0, b"\x01" * 64, storage_bytes, 0, False, b"\x02" * 64, 0,
                                 b"\x03" * 64, True)


def test_the_cuda_ipc_payload_passes_vllms_serializer(monkeypatch):
    tensor = torch.randn(8, 4, dtype=torch.bfloat16)
    reduced = _cuda_reduce(tensor)
    monkeypatch.setattr("torch.multiprocessing.reductions.reduce_tensor", lambda t: reduced)
    # the GPU path's own code: _shareable of a CUDA tensor (one that says it is, where no GPU is)
    kind, payload, _ = vllm_engine._shareable(tensor.cuda() if torch.cuda.is_available() else _FakeCuda(tensor))
    assert kind == "ipc" and isinstance(payload, bytes)
    chunk = [("model.norm.weight", (kind, payload))]
    (received,) = _through_vllm("seedfast_load_weights", (chunk,))
    name, (kind_back, payload_back) = received[0]
    assert (name, kind_back) == ("model.norm.weight", "ipc")
    rebuild, args = vllm_engine._unpack(payload_back)
    assert rebuild is reduced[0] and len(args) == 15
    assert args[5] == torch.bfloat16 and tuple(args[1]) == (8, 4) and args[7] == reduced[1][7]


def test_the_payload_as_sent_before_is_refused_by_vllms_serializer():
    """The old form, (rebuild function, arguments) itself: what the engine would raise on the first GPU push."""
    reduced = _cuda_reduce(torch.randn(2, 2))
    with pytest.raises(TypeError, match="not serializable"):
        _through_vllm("seedfast_load_weights", ([("w", ("ipc", reduced))],))


def test_a_cpu_tensor_payload_arrives_whole():
    tensor = torch.randn(300, 7)  # above vLLM's inline threshold too: a side buffer in the message
    kind, payload, _ = vllm_engine._shareable(tensor)
    assert kind == "cpu"
    (received,) = _through_vllm("seedfast_load_weights", ([("w", (kind, payload))],))
    back = vllm_engine._unpack(bytes(received[0][1][1]))
    assert torch.equal(back, tensor)


class _FakeCuda:
    """A CPU tensor that says it is on CUDA, for _shareable's branch (reduce_tensor is faked alongside)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor
        self.is_cuda = True

    def detach(self) -> _FakeCuda:
        return self

    def contiguous(self) -> _FakeCuda:
        return self
