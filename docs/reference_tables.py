"""The generated part of docs/reference.md: the CLI commands and every config option (`make docs` writes it there).

Everything comes from the code itself: `seedfast.cli.COMMANDS` for the commands, and the dataclass schema of
`seedfast.config` (`options()`, the sections' docs) for the options, in schema order. Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses

from seedfast import cli, config


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("<", "&lt;")


def _bounds() -> dict[str, str]:
    """Dotted key -> its numeric bounds as text ('> 0', '>= 1, <= 1'), from the fields' metadata."""
    out: dict[str, str] = {}

    def walk(obj: object, prefix: str) -> None:
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if dataclasses.is_dataclass(value):
                walk(value, f"{prefix}{f.name}.")
                continue
            meta = f.metadata
            parts = [f"{sign} {meta[name]}" for name, sign in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="))
                     if meta.get(name) is not None]
            out[f"{prefix}{f.name}"] = ", ".join(parts)

    walk(config.Config(), "")
    return out


def commands_table() -> list[str]:
    lines = ["| command | implemented in | what it does |", "|---|---|---|"]
    for name, command in {**cli.COMMANDS, **cli.TOOLS}.items():
        lines.append(f"| `seedfast {name}` | `{command.module}:{command.attr}` | {_cell(command.help)} |")
    lines.append(f"| `seedfast {cli.SHOW_CONFIG}` | `seedfast/cli.py` | print the resolved config as YAML |")
    return lines


def section_docs() -> dict[str, str]:
    """Top-level key -> its one-line doc ('' for top-level leaves such as `algorithm`)."""
    return {f.name: f.metadata.get("doc", "") for f in dataclasses.fields(config.Config)}


def options_tables() -> list[str]:
    docs = section_docs()
    bounds = _bounds()
    lines: list[str] = []
    current = None
    for o in config.options():
        head = o.key.split(".")[0] if "." in o.key else ""
        if head != current:
            current = head
            title = f"`{head}`: {docs.get(head, '')}" if head else "Top level"
            lines += ["", f"### {title}", "",
                      "| key | default | type | range | meaning |", "|---|---|---|---|---|"]
        kind = config.type_name(o.type)
        rng = _cell(bounds.get(o.key, ""))
        lines.append(f"| `{o.key}` | `{config.format_value(o.default)}` | {_cell(kind)} | {rng} | {_cell(o.doc)} |")
    return lines


def reference() -> str:
    return "\n".join(["## Commands", "", *commands_table(), "", "## Config options", *options_tables()])
