"""The trainer -> rollout producer weight group (distributed/weight_channel.py) between two real processes over gloo:
every version arrives exactly, bucket by bucket, into a model that started with other weights; every tensor is sent
once (a tied LM head is the embedding); STOP ends the receiver."""

from __future__ import annotations

import multiprocessing as mp
import pickle

import torch

from seedfast.distributed.weight_channel import (
    STOP,
    WeightChannel,
    backend_for,
    bucket_layout,
    fingerprint,
    load_buckets,
    loaded_fingerprint,
)
from seedfast.distributed.weight_push import hf_named_tensors
from seedfast.model.decoder import build_decoder
from tests.scoring.scoring_helpers import make_config

BUCKET = 8 << 10  # several buckets for the tiny decoder


def _receiver(port: int, out) -> None:
    torch.set_num_threads(1)
    model = build_decoder(make_config("qwen2"), dtype=torch.float32, seed=4)  # other weights than the sender's
    layout = bucket_layout(model, BUCKET)
    channel = WeightChannel.connect(port, torch.device("cpu"), timeout_s=60)
    got = []
    while True:
        version, flats = channel.receive(layout, torch.float32)
        if version == STOP:
            break
        load_buckets(model, layout, flats)
        got.append((version, len(flats), {k: v.clone() for k, v in model.state_dict().items()},
                    loaded_fingerprint(model, layout)))
    out.send_bytes(pickle.dumps(got))  # by value: torch's shared-memory pickling outlives no sender


def test_versions_arrive_exactly_in_buckets():
    sender = build_decoder(make_config("qwen2"), dtype=torch.float32, seed=3)
    assert sender.config.tie_word_embeddings
    ctx = mp.get_context("spawn")
    recv_end, send_end = ctx.Pipe(duplex=False)
    channel = WeightChannel.listen(torch.device("cpu"), timeout_s=60)
    proc = ctx.Process(target=_receiver, args=(channel.port, send_end))
    proc.start()
    try:
        expected, prints = [], []
        for version in (0, 1):
            stats = channel.send(version, hf_named_tensors(sender), BUCKET)
            prints.append(stats["fingerprint"])
            expected.append({k: v.clone() for k, v in sender.state_dict().items()})
            n_bytes = sum(t.numel() * t.element_size() for _, t in hf_named_tensors(sender))
            assert stats["bytes"] == n_bytes and stats["buckets"] > 2
            with torch.no_grad():  # the next version differs everywhere
                for p in sender.parameters():
                    p.add_(0.5)
        channel.stop()
        got = pickle.loads(recv_end.recv_bytes())
    finally:
        proc.join(timeout=60)
        if proc.is_alive():
            proc.kill()
    assert proc.exitcode == 0
    assert [v for v, *_ in got] == [0, 1]
    assert [p for *_, p in got] == prints and prints[0] != prints[1]  # what was loaded is what was sent
    for (_, n_buckets, state, _), want in zip(got, expected, strict=True):
        assert n_buckets == len(bucket_layout(sender, BUCKET))
        assert state.keys() == want.keys()
        for name in want:
            assert torch.equal(state[name], want[name]), name
    sent = [slot.name for bucket in bucket_layout(sender, BUCKET) for slot in bucket]
    assert sent == list(expected[0])  # every tensor once, in the state dict's order (a tied LM head is the embedding)

def test_the_backend_follows_the_device():
    assert backend_for(torch.device("cpu")) == "gloo"
    assert backend_for(torch.device("cuda", 0)) == "nccl"


def test_the_fingerprint_is_exact_and_order_free():
    a, b = torch.randn(1000), torch.randn(37).to(torch.bfloat16)
    assert fingerprint([a, b]) == fingerprint([b, a]) == fingerprint([b]) + fingerprint([a])
    # the integers the bits spell, by hand
    assert fingerprint([torch.tensor([1.0, -2.0])]) == 0x3F800000 + (0xC0000000 - 2**32)
    flipped = a.clone()
    flipped.view(torch.int32)[500] ^= 1  # one bit of one weight
    assert fingerprint([flipped]) != fingerprint([a])


def test_the_fingerprint_widens_a_chunk_at_a_time_to_the_same_value(monkeypatch):
    """Summed over chunks (a 32 MiB int64 workspace on the device, not 4x a bf16 bucket), the fingerprint is the sum of
    every bit pattern, wrapping in int64: here against Python's exact sum of the bf16 words, chunk 7 elements."""
    from seedfast.distributed import weight_channel

    w = torch.randn(1003).to(torch.bfloat16)
    words = w.view(torch.int16).tolist()
    whole = weight_channel.fingerprint([w])
    monkeypatch.setattr(weight_channel, "FINGERPRINT_CHUNK", 7)
    assert weight_channel.fingerprint([w]) == whole == sum(words)
    widened = []
    real_sum = torch.Tensor.sum

    def recording(t, *args, **kwargs):
        widened.append(t.numel())
        return real_sum(t, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "sum", recording)
    weight_channel.fingerprint([w])
    assert max(widened) == 7 and sum(widened) == w.numel()
    big = torch.full((4,), 2**62, dtype=torch.int64)  # wraps as one int64 sum would
    assert weight_channel.fingerprint([big]) == 0


def _threads_and_fds() -> tuple[int, int]:
    import os

    return len(os.listdir("/proc/self/task")), len(os.listdir("/proc/self/fd"))


def test_close_ends_the_group_and_the_store_on_both_sides():
    """Both ranks in this process (gloo, threads): after close() on each side no thread, descriptor or socket of
    the group or the store is left, though the channels themselves are still referenced; closing twice is a no-op
    and a closed channel refuses to send."""
    import threading

    import pytest

    torch.set_num_threads(1)
    cpu = torch.device("cpu")

    def cycle() -> tuple[WeightChannel, WeightChannel]:
        sender = WeightChannel.listen(cpu, timeout_s=60)
        receiver = WeightChannel.connect(sender.port, cpu, timeout_s=60, wait_forever=True)
        got = []
        thread = threading.Thread(target=lambda: got.append(receiver.receive([], torch.float32)))
        thread.start()
        sender.send(5, [], BUCKET)
        thread.join(timeout=60)
        assert got == [(5, [])]
        receiver.close()
        sender.close()
        sender.close()
        return sender, receiver

    kept = [cycle()]  # warm: gloo's first use
    before = _threads_and_fds()
    kept += [cycle() for _ in range(5)]
    assert _threads_and_fds() == before
    with pytest.raises(RuntimeError, match="closed"):
        kept[-1][0].send(6, [], BUCKET)
