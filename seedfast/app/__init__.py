"""The commands of `seedfast <command>`, one module each (envs, collect, sft, train, eval, demo), each a
`main(cfg, **flags)` that builds its pieces with the one set of builders (runtime/setup.py) and hands them to
the libraries. Only seedfast/cli.py imports this package. See docs/architecture.md."""

from __future__ import annotations

import sys


def end_command(completed: bool) -> None:
    """What every command ends with: the process group it started under torchrun (runtime/setup.py
    start_processes) ends with it (distributed/mesh.py end_process_group)."""
    if "torch.distributed" in sys.modules:  # a one-process command that never imported it has nothing to end
        from seedfast.distributed.mesh import end_process_group

        end_process_group(completed)
