"""What a resumed run changed: its config against the one its checkpoint was written with (docs/reference.md,
'Checkpoints and resume').

Keys whose change the checkpoint cannot follow are refused (FIXED_ON_RESUME: the model's shape and tokenizer, the
algorithm, the dtype of the saved optimizer states); every other key may change and takes effect from the resumed
step on. `trainer.resume` itself is how a resume is asked for, not a change.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from seedfast.config.loading import parse_yaml
from seedfast.config.schema import Config, ConfigError

# prefixes of dotted keys: a key equal to one, or below it, cannot change on resume
FIXED_ON_RESUME: dict[str, str] = {
    "algorithm": "the loss and the states it keeps are the algorithm's",
    "model.path": "the checkpoint holds that model's weights",
    "model.tiny": "the checkpoint's tensors have the tiny decoder's shapes",
    "model.tokenizer": "the policy's token ids are that tokenizer's",
    "optim.master_dtype": "the checkpoint's weights and AdamW states are in that dtype",
}
NOT_A_CHANGE = ("trainer.resume",)


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(node, Mapping):
        return {prefix.rstrip("."): node}
    out: dict[str, Any] = {}
    for key, value in node.items():
        out.update(_flat(value, f"{prefix}{key}."))
    return out


def config_changes(saved_yaml: str, cfg: Config, source: str = "checkpoint config") -> dict[str, tuple[Any, Any]]:
    """{dotted key: (value in `saved_yaml`, value in `cfg`)} for every key that differs (both sides read back from
    YAML, so a value is compared as it is written)."""
    old = _flat(parse_yaml(saved_yaml, source) or {})
    new = _flat(parse_yaml(cfg.to_yaml()))
    missing = object()
    changes = {}
    for key in sorted(set(old) | set(new)):
        if key in NOT_A_CHANGE:
            continue
        before, after = old.get(key, missing), new.get(key, missing)
        if before != after:
            changes[key] = (None if before is missing else before, None if after is missing else after)
    return changes


def fixed_key(key: str) -> str | None:
    """Why `key` cannot change on resume, or None when it can."""
    for prefix, why in FIXED_ON_RESUME.items():
        if key == prefix or key.startswith(prefix + "."):
            return why
    return None


def refuse_fixed_changes(changes: Mapping[str, tuple[Any, Any]], checkpoint: str) -> None:
    """A ConfigError naming every key of `changes` that cannot change on resume, with both values and why."""
    refused = [f"{k}: {old!r} -> {new!r} ({why})" for k, (old, new) in changes.items() if (why := fixed_key(k))]
    if refused:
        raise ConfigError(f"resuming {checkpoint}: these keys cannot change on resume: " + "; ".join(refused)
                          + " (start a new run, or resume with the checkpoint's values)")


def describe_changes(changes: Mapping[str, tuple[Any, Any]]) -> str:
    return ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in changes.items())
