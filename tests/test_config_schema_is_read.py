"""Every config option is read by some code path: an option that nothing reads is a promise the code does not keep.

Static, on purpose: a field counts as read when the package (seedfast/config/ itself excluded: validation is not
use) accesses it as an attribute. A name that several sections share (`temperature`, `lr`, ...) must be read through
its own section: `rollout.temperature`, or a local name the code gives that section (ALIASES).
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from pathlib import Path

from seedfast.config import Config

PACKAGE = Path(__file__).resolve().parents[1] / "seedfast"
CONFIG = PACKAGE / "config"  # the schema and its validation
# local names the code binds a section to (e.g. `e = cfg.env`, `ext = skill.external`, `train_sft(..., cfg.sft)`)
ALIASES = {
    "env": ("env", "e"),
    "skill.external": ("external", "ext"),
    "sft": ("sft", "cfg"),
    "optim": ("optim", "o"),
    "rollout": ("rollout", "r"),
    "trainer": ("trainer", "t"),
    "model.tiny": ("tiny",),
}


def leaves(cls: type, prefix: str = "") -> list[tuple[str, str]]:
    out = []
    for f in dataclasses.fields(cls):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default):
            out += leaves(type(default), f"{prefix}{f.name}.")
        else:
            out.append((prefix.rstrip("."), f.name))
    return out


def package_source() -> str:
    return "\n".join(p.read_text() for p in sorted(PACKAGE.rglob("*.py")) if CONFIG not in p.parents)


def unread(fields: list[tuple[str, str]], source: str) -> list[str]:
    """The fields (section, name) that `source` never reads."""
    shared = {name for name, n in Counter(name for _, name in fields).items() if n > 1}
    missing = []
    for section, name in fields:
        if name in shared:
            owners = ALIASES.get(section, (section.rsplit(".", 1)[-1],))
            pattern = r"\b(?:" + "|".join(map(re.escape, owners)) + r")\." + re.escape(name) + r"\b"
        else:
            pattern = r"\." + re.escape(name) + r"\b|getattr\([^)]*[\"']" + re.escape(name) + r"[\"']"
        if not re.search(pattern, source):
            missing.append(f"{section + '.' if section else ''}{name}")
    return missing


def test_every_config_option_is_read_somewhere():
    missing = unread(leaves(Config), package_source())
    assert not missing, f"config options that no code path reads: {missing}"


def test_the_check_finds_options_that_only_look_read():
    fields = [("rollout", "tensor_parallel"), ("dist", "tensor_parallel"), ("skill", "max_step_skills")]
    source = "engine(tp=cfg.rollout.tensor_parallel)\nMAX_STEP_SKILLS = 5\n"
    # a shared name read through another section, and a constant that merely resembles the option
    assert unread(fields, source) == ["dist.tensor_parallel", "skill.max_step_skills"]
    assert unread([("grsd", "judge")], "kind = getattr(cfg.grsd, 'judge')") == []
