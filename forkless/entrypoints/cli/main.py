"""The ``forkless`` command line.

Sub-commands live in their own modules and are imported only when chosen, so that
``forkless plugins list`` never pays for torch.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import sys
import time
from typing import NoReturn

from forkless.entrypoints.cli.config_file import CONFIG_FLAG, expand_config_file
from forkless.entrypoints.cli.flexible_args import normalize_argv
from forkless.logger import configure_logging
from forkless.plugins import DEPRECATIONS, DeprecatedError
from forkless.version import __version__

# When this process began running forkless code; start-up times are measured from it.
STARTED = time.monotonic()

# sub-command -> module with add_parser(subparsers); each sets args.func.
SUBCOMMANDS = {
    "serve": "forkless.entrypoints.cli.serve",
    "generate": "forkless.entrypoints.cli.generate",
    "plugins": "forkless.entrypoints.cli.plugins",
    "bench": "forkless.entrypoints.cli.bench",
    "disagg-proxy": "forkless.entrypoints.cli.disagg_proxy",
}


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The sub-commands' parsers, by name."""
    for action in parser._actions:  # argparse has no public way to reach them
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="forkless", description="A small, fast LLM inference server built of plugins.")
    parser.add_argument("--version", action="version", version=f"forkless {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, module in SUBCOMMANDS.items():
        # Only the chosen sub-command's module is imported; the others get a stub entry
        # so that `forkless --help` still lists them.
        if name == chosen:
            try:
                importlib.import_module(module).add_parser(subparsers)
            except ModuleNotFoundError as exc:
                if exc.name != module:
                    raise
                subparsers.add_parser(name, help="(not available in this build)")
        else:
            subparsers.add_parser(name, help=f"run `forkless {name} --help` for details")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # `forkless serve` imports a few hundred thousand objects (FastAPI, pydantic,
    # transformers) that all live as long as the server: the cyclic collector walking
    # them again and again while they are created cost ~12 % of the API server's start-up
    # CPU. It is off until the server is built (serve.py enables it, then freezes what
    # exists, see forkless.gc_tuning), and back as it was when main returns.
    collecting = gc.isenabled()
    if next((a for a in argv if not a.startswith("-")), None) == "serve":
        gc.disable()
    try:
        return _main(argv)
    finally:
        if collecting:
            gc.enable()


def _main(argv: list[str]) -> int:
    configure_logging()
    parser = build_parser(argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    subparser = _subparsers(parser).get(command) if command else None
    if subparser is not None:
        try:
            argv = normalize_argv(argv, subparser)
            # (serve alone takes --config; elsewhere argparse refuses it as unrecognized.)
            if command == "serve" and (CONFIG_FLAG in argv or any(a.startswith(CONFIG_FLAG + "=") for a in argv)):
                argv = expand_config_file(argv, subparser)
        except ValueError as exc:
            print(f"forkless {command}: error: {exc}", file=sys.stderr)
            return 2
    try:  # after normalize_argv: a removed flag spelled with underscores is still named
        DEPRECATIONS.check_cli_args(argv)
        DEPRECATIONS.check_environ()
    except DeprecatedError as exc:
        print(f"forkless: error: {exc}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 0 if args.command is None else 2
    return int(func(args) or 0)


def run() -> NoReturn:
    """The ``forkless`` console script: :func:`main`, then this process's end without the
    interpreter's teardown (:func:`forkless.protocol.ipc.exit_process`; ~0.3-0.7 s once
    the command has imported torch or transformers). An exception ends it as usual."""
    from forkless.protocol.ipc import exit_process

    exit_process(main())


if __name__ == "__main__":
    run()
