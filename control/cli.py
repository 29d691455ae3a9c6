"""``specctl``: the command-line entry point.

Each subcommand lives in ``control/commands/<name>.py`` with ``register(subparsers)``; modules must
keep heavy imports (torch, tritonclient, fastapi) inside their run functions so ``specctl --help``
stays fast. Errors the user can act on (``SpecctlError``) print one line and exit non-zero.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from control import __version__
from control.errors import SpecctlError

# name -> module; order is the order shown in --help
COMMANDS = {
    "build": "control.commands.build",
    "explain": "control.commands.explain",
    "generate": "control.commands.generate",
    "plan": "control.commands.plan",
    "control-plane": "control.commands.control_plane",
    "roofline": "control.commands.roofline",
    "sim": "control.commands.sim",
    "record-acceptance": "control.commands.record",
    "profile": "control.commands.profile",
    "serve": "control.commands.serve",
    "bench": "control.commands.bench",
    "demo": "control.commands.demo",
}


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors that point at --help."""

    def error(self, message: str):  # noqa: D401 - argparse API
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="specctl", description="Adaptive speculative decoding control plane.")
    parser.add_argument("--version", action="version", version=f"specctl {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for unexpected errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for module in COMMANDS.values():
        importlib.import_module(module).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        rc = args.run(args)
        return int(rc or 0)
    except SpecctlError as e:
        print(f"specctl {args.command}: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print(f"specctl {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as e:  # a bug, not bad input: say so, keep the traceback behind --debug
        if args.debug:
            raise
        print(f"specctl {args.command}: internal error: {type(e).__name__}: {e} (rerun with --debug for the traceback)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
