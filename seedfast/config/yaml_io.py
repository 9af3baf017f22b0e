"""The YAML dialect of config files, read and written: YAML 1.2 scalars in, leaf lists in flow style out.

Imports nothing from seedfast, so that both schema.py (`Config.to_yaml`) and loading.py (`parse_yaml`) can use it
without importing each other.
"""

from __future__ import annotations

import re
from typing import Any

import yaml


class _Loader(yaml.SafeLoader):
    """YAML 1.2 scalars: `1e-6` is a float, `yes`/`on` stay strings, `5:7` is not base-60."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers
            if tag not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                              list("tTfF"))
_Loader.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(r"^[-+]?[0-9]+$"), list("-+0123456789"))
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^(?:[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)"
               r"|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."))


class _Dumper(yaml.SafeDumper):
    """Leaf lists in flow style (`levels: [3, 4]`), the way people write them."""


_Dumper.add_representer(list, lambda d, v: d.represent_sequence("tag:yaml.org,2002:seq", v, flow_style=True))


def load_yaml(text: str) -> Any:
    """`text` parsed in this dialect; raises yaml.YAMLError (loading.parse_yaml turns it into a ConfigError)."""
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


def dump_yaml(data: Any) -> str:
    """`data` as YAML in this dialect, keys in their order."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True)
