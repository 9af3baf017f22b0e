"""The commands of `seedfast <command>`, one module each (envs, collect, sft, train, eval, demo), each a
`main(cfg, **flags)` that builds its pieces with the one set of builders (runtime/setup.py) and hands them to
the libraries. Only seedfast/cli.py imports this package. See docs/architecture.md."""
