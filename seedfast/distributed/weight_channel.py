"""The policy's weights from the trainer to a rollout producer in another process (docs/architecture.md,
'Asynchronous rollouts'): a two-rank process group of its own (gloo on CPU, NCCL on GPU: the same code, the backend
chosen by the device), the trainer rank 0, the producer rank 1, each version sent as a header and then one broadcast
per bucket of `weight_push.buckets`.

    # trainer                                              # producer (rank 1)
    channel = WeightChannel.listen(device)                 receiver = WeightChannel.connect(port, device)
    ... start the producer with channel.port ...           layout = bucket_layout(model, bucket_bytes)
    channel.send(version, hf_named_tensors(policy), b)     version, flats = receiver.receive(layout)
                                                           load_buckets(model, layout, flats)

With LoRA and rollout.lora_sync=adapter the tensors sent are the adapters alone (weight_push.adapter_named_tensors,
in their own dtype; `named_layout` on the producer's adapted copy of the base gives their layout), a few MB where
the merged model is hundreds.

The group is built from its own TCPStore, never the default process group, so it lives beside torchrun's group of
a sharded trainer. Both sides derive the same bucket layout from the same module (names, shapes, dtype), so only
the flat buckets travel. A version of -1 tells the receiver that no more weights come. `close()` ends the group and
the store (their threads and sockets), on either side.

Timeouts: `timeout_s` bounds the rendezvous and, by default, every broadcast; None waits for ever. A receiver that
waits for the next version while the trainer learns connects with `wait_forever` (the producer's lifeline ends it
when the trainer dies).

NCCL: a broadcast's `.wait()` neither blocks the CPU nor raises when the peer is dead or stopped; it makes the
sender's stream wait, so the next thing that reads a tensor back (a fingerprint's `.cpu()`) would block behind the
collective until NCCL's watchdog aborts the whole process. So the sender never waits on NCCL: its broadcasts are
kept (`_pending`) until the caller knows by other means that they landed (the producer's ack on a pipe:
train/async_rollout.py `RolloutProducer.received`), then `sent()`; when they cannot land, `abort()` ends the
group with them in flight. The NCCL group's own timeout is longer than `timeout_s` by NCCL_MARGIN, so the caller's
bound on the CPU, not the watchdog, ends a push.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from seedfast.distributed.weight_push import buckets, hf_named_tensors

STOP = -1
FOREVER = datetime.timedelta(days=365)  # "no timeout" for the store and gloo, which need one
NCCL_MARGIN = datetime.timedelta(seconds=120)


@dataclass(frozen=True)
class Slot:
    name: str
    shape: tuple[int, ...]
    numel: int


Layout = list[list[Slot]]


_SAME_SIZE_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
# elements widened to int64 at a time: the fingerprint's workspace is 32 MiB on the tensor's device whatever the
# bucket (widening a whole bf16 bucket took 4x its size, which the memory plan did not count)
FINGERPRINT_CHUNK = 1 << 22


def fingerprint(tensors: Iterable[torch.Tensor]) -> int:
    """The sum of the tensors' bit patterns read as integers (wrapping in int64): exact and independent of the order
    and threads of the reduction, so the trainer's sent weights and the producer's loaded ones can be compared for
    equality (a push that silently loads nothing, verl #7495, shows as a different fingerprint). Summed a chunk at a
    time (wrapping addition is associative: the same value), on the tensors' device, read back once."""
    totals: dict[torch.device, torch.Tensor] = {}
    for t in tensors:
        bits = t.detach().contiguous().reshape(-1).view(_SAME_SIZE_INT[t.element_size()])
        total = totals.setdefault(bits.device, torch.zeros((), dtype=torch.int64, device=bits.device))
        for chunk in bits.split(FINGERPRINT_CHUNK):
            total += chunk.sum(dtype=torch.int64)
    return _wrap(sum(int(t.cpu()) for t in totals.values()))


def loaded_fingerprint(model: torch.nn.Module, layout: Layout) -> int:
    """`fingerprint` of `model`'s tensors named by `layout` (what the producer rolls out with)."""
    state = model.state_dict(keep_vars=True)
    return fingerprint(state[slot.name] for bucket in layout for slot in bucket)


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def _group(store: dist.Store, rank: int, device: torch.device, timeout: datetime.timedelta) -> dist.ProcessGroup:
    if backend_for(device) == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout if timeout >= FOREVER else timeout + NCCL_MARGIN
        return dist.ProcessGroupNCCL(store, rank, 2, options)
    return dist.ProcessGroupGloo(store, rank, 2, timeout)


def _delta(seconds: float | None) -> datetime.timedelta:
    return FOREVER if seconds is None else datetime.timedelta(seconds=seconds)


def bucket_layout(model: torch.nn.Module, bucket_bytes: int, dtype: torch.dtype | None = None) -> Layout:
    """The buckets `send` makes of `model`'s tensors (HF names, in order), as names and shapes."""
    return named_layout(hf_named_tensors(model, dtype=dtype), bucket_bytes)


def named_layout(named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int) -> Layout:
    """The buckets `send` makes of these (name, tensor), as names and shapes (e.g. a LoRA model's adapters alone:
    weight_push.adapter_named_tensors)."""
    return [[Slot(name, tuple(t.shape), t.numel()) for name, t in bucket]
            for bucket in buckets(named_tensors, bucket_bytes)]


def named_buckets(layout: Layout, flats: list[torch.Tensor]) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Received flat buckets as buckets of (HF name, tensor): views into the flats, in the sender's order (what a
    rollout engine's push takes, weight_push.py's buckets)."""
    for bucket, flat in zip(layout, flats, strict=True):
        yield [(slot.name, part.view(slot.shape))
               for slot, part in zip(bucket, flat.split([s.numel for s in bucket]), strict=True)]


def load_buckets(model: torch.nn.Module, layout: Layout, flats: list[torch.Tensor]) -> None:
    """Copy received flat buckets into `model`'s tensors (a tied tensor is written once, as it was sent)."""
    state = model.state_dict(keep_vars=True)
    with torch.no_grad():
        for bucket in named_buckets(layout, flats):
            for name, tensor in bucket:
                state[name].copy_(tensor)


def _wrap(value: int) -> int:
    """`value` wrapped into int64 as torch's sum wraps."""
    return (value + 2**63) % 2**64 - 2**63


class WeightChannel:
    """One side of the trainer -> producer weight group; the group itself is built on first use (building it waits
    for the other rank)."""

    def __init__(self, store: dist.Store, rank: int, device: torch.device, op_timeout: datetime.timedelta) -> None:
        self.rank = rank
        self.device = device
        self.port: int = store.port
        self._store: dist.Store | None = store
        self._timeout = op_timeout
        self.group: dist.ProcessGroup | None = None
        self._pending: list[Any] = []  # NCCL, the sender: broadcasts enqueued and not known to have landed

    @classmethod
    def listen(cls, device: torch.device, timeout_s: float | None = 600.0) -> WeightChannel:
        """The trainer's side, rank 0: a store on a free local port (`port`, handed to the producer)."""
        store = dist.TCPStore("127.0.0.1", 0, 2, True, wait_for_workers=False, timeout=_delta(timeout_s))
        return cls(store, 0, device, _delta(timeout_s))

    @classmethod
    def connect(cls, port: int, device: torch.device, timeout_s: float | None = 600.0, *,
                wait_forever: bool = False) -> WeightChannel:
        """The producer's side, rank 1. `wait_forever`: no timeout on the broadcasts (the rendezvous keeps
        `timeout_s`)."""
        store = dist.TCPStore("127.0.0.1", port, 2, False, timeout=_delta(timeout_s))
        return cls(store, 1, device, FOREVER if wait_forever else _delta(timeout_s))

    def open(self) -> None:
        if self._store is None:
            raise RuntimeError("the weight channel is closed")
        if self.group is None:
            self.group = _group(self._store, self.rank, self.device, self._timeout)

    def sent(self) -> None:
        """The sender, once the receiver said it holds what was sent: NCCL's broadcasts are complete (the waits
        return at once) and their tensors may go."""
        for work in self._pending:
            work.wait()
        self._pending.clear()

    def abort(self) -> None:
        """`close`, for a peer that died or stopped: the group ends now, broadcasts in flight included."""
        group, self.group, self._store = self.group, None, None
        self._pending.clear()
        if group is not None:
            try:
                group.abort()
            except RuntimeError:  # already torn down by the peer's death
                pass

    def close(self) -> None:
        """End the group and drop the store (the listening side's server socket closes with its last reference);
        a no-op the second time. Call it once the other side is gone or done: a broadcast in flight fails."""
        group, self.group, self._store = self.group, None, None
        self._pending.clear()
        if group is not None:
            try:
                group.shutdown()
            except RuntimeError:  # the peer died first: the group is torn down all the same
                pass

    def _broadcast(self, tensor: torch.Tensor) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self.open()
        assert self.group is not None
        work = self.group.broadcast([tensor], opts)
        if self.rank == 0 and backend_for(self.device) == "nccl":
            self._pending.append(work)  # never waited on here (the module docstring)
        else:
            work.wait()

    def send(self, version: int, named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
             ) -> dict[str, float]:
        """Rank 0: the header (version, bucket count unknown ahead: the receiver's layout says it), then each
        bucket flattened into one tensor. Returns bytes and buckets sent, and the weights' `fingerprint`."""
        self._broadcast(torch.tensor([version], dtype=torch.int64, device=self.device))
        sent = n = 0
        prints = []
        for bucket in buckets(named_tensors, bucket_bytes):
            flat = torch.cat([t.reshape(-1).to(self.device) for _, t in bucket])
            prints.append(fingerprint([flat]))
            self._broadcast(flat)
            sent += flat.numel() * flat.element_size()
            n += 1
        return {"bytes": float(sent), "buckets": float(n), "fingerprint": _wrap(sum(prints))}

    def stop(self) -> None:
        """Rank 0: tell the receiver no more versions come."""
        self._broadcast(torch.tensor([STOP], dtype=torch.int64, device=self.device))

    def receive(self, layout: Layout, dtype: torch.dtype) -> tuple[int, list[torch.Tensor]]:
        """Rank 1: the next version and its flat buckets ((STOP, []) when the trainer is done)."""
        header = torch.zeros(1, dtype=torch.int64, device=self.device)
        self._broadcast(header)
        version = int(header.item())
        if version == STOP:
            return STOP, []
        flats = []
        for bucket in layout:
            flat = torch.empty(sum(s.numel for s in bucket), dtype=dtype, device=self.device)
            self._broadcast(flat)
            flats.append(flat)
        return version, flats
