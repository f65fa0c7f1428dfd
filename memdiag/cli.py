"""``memdiag``: the command line. Parses, dispatches to a verb, turns user errors into one line."""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn, cast

from memdiag import __version__
from memdiag._errors import UserError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2, no usage dump
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from memdiag.commands import COMMANDS

    parser = _Parser(prog="memdiag", description="Memory diagnostics for Horovod collectives in "
                                                 "data-parallel TensorFlow training.")
    parser.add_argument("--version", action="version", version=f"memdiag {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name, command_class in COMMANDS.items():
        command = command_class()
        sub_parser = sub.add_parser(name, help=command.help, description=command.help)
        command.prepare_parser(sub_parser)
        sub_parser.set_defaults(command_object=command)
    return parser


def main(argv: list[str] | None = None) -> int:
    # TensorFlow's start-up notices would bury the reports; ranks inherit this too.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    argv = list(sys.argv[1:] if argv is None else argv)
    # Everything after `--` belongs to the user's training script.
    script_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, script_args = argv[:cut], argv[cut + 1:]
    args = build_parser().parse_args(argv)
    try:
        return cast(int, args.command_object.run(args, script_args))
    except UserError as exc:
        print(f"memdiag: error: {exc}", file=sys.stderr)
        return exc.exit_status
    except KeyboardInterrupt:
        print("memdiag: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader of the output went away (`memdiag report ... | head`): stop quietly, as other
        # command-line tools do; the interpreter's final flush must not fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    raise SystemExit(main())
