"""``python -m benchmarks <command> [options]``: runs one command of the lab (its module's
``main(argv)``); ``python -m benchmarks`` or ``--help`` lists the commands."""
from __future__ import annotations

import importlib
import os
import sys

#: command -> module (in `benchmarks`); each module's docstring starts "Command ``name``: ...".
COMMANDS = {"bench": "bench", "measure": "measure", "ncu": "ncu", "tune": "tune",
            "resources": "resources", "check": "check", "sanitize": "sanitize",
            "host-cost": "host_cost", "ring": "ring", "decode": "decode",
            "first-call": "first_call", "train-step": "train_step", "rates": "rates", "pick": "pick",
            "fp8": "fp8", "replace": "replace"}
#: Commands that only compile (PTX, ptxas) and need Numba's real CUDA target, not its simulator.
COMPILE_ONLY = ("resources", "check")


def summary(command: str) -> str:
    """The one-line description of a command (`benchmarks.common.first_sentence`)."""
    from benchmarks.common import first_sentence
    return first_sentence(importlib.import_module(f"benchmarks.{COMMANDS[command]}").__doc__)


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: python -m benchmarks <command> [options]",
             "       python -m benchmarks <command> --help", "", "commands:"]
    lines += [f"  {name:{width}}  {summary(name)}" for name in COMMANDS]
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"python -m benchmarks: unknown command {command!r}; commands: "
              f"{', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    if command in COMPILE_ONLY:
        os.environ["NUMBA_ENABLE_CUDASIM"] = "0"     # before anything imports numba
    module = importlib.import_module(f"benchmarks.{COMMANDS[command]}")
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
