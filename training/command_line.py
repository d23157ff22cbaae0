"""How every command (`hf-outheads train | export | mtp-distill | quickstart`) reads its command line
and refuses what it cannot run, as argparse and transformers' `HfArgumentParser` do:

- `--a_b` and `--a-b` are one option (HfArgumentParser, TRL's parser and `hf-outheads export
  --text-file` accept both); no abbreviations;
- `--help` shows each option's default;
- bad input (an option, a config or data file, the folders named) is refused before anything is
  written, in one line on stderr, with exit status 2: argparse's status for a usage error
  (`refuse`). A run that starts and then fails (a non-finite loss, a full disk) exits 1.
"""

from __future__ import annotations

import argparse
import sys


class Refusal(SystemExit):
    """A command refusing its input: exit status 2; `str()` is the one-line message, which
    `refuse` has printed on stderr."""

    def __init__(self, message: str):
        super().__init__(message)
        self.code = 2


def refuse(message) -> Refusal:
    """Print `message` on stderr as one line and return the `Refusal` to raise (as argparse's
    `parser.error` prints, then exits 2)."""
    line = " ".join(str(message).split("\n"))
    print(line, file=sys.stderr, flush=True)
    return Refusal(line)


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The description as written (the scripts' docstrings), each option's default after its help."""


class CommandParser(argparse.ArgumentParser):
    """`argparse.ArgumentParser` with the rules of this module's docstring."""

    def __init__(self, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(**kwargs)

    def spelling(self, argument: str) -> str:
        """`argument` as this parser declares it: `--a-b` for a declared `--a_b`, and the other way round."""
        flag, equals, value = argument.partition("=")
        if not flag.startswith("--") or flag in self._option_string_actions:
            return argument
        for other in ("--" + flag[2:].replace("-", "_"), "--" + flag[2:].replace("_", "-")):
            if other in self._option_string_actions:
                return other + equals + value
        return argument

    def parse_known_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        end = args.index("--") if "--" in args else len(args)
        return super().parse_known_args([*map(self.spelling, args[:end]), *args[end:]], namespace)

    def error(self, message: str):
        raise refuse(f"{self.prog}: error: {message} (`{self.prog} --help` lists the options)")


def typed(spec):
    """An argparse `type` reading a number within `spec` (`hf_outheads.head_options.Spec`, the
    declaration head and training options use), so that a value out of range is a usage error."""
    def read(text: str):
        try:
            value = int(text) if spec.kind == "int" else float(text)
        except ValueError:
            value = text
        if not spec.accepts(value):
            raise argparse.ArgumentTypeError(f"must be {spec.describe()}, got {text!r}")
        return value

    read.__name__ = spec.kind  # argparse names the type in its messages
    return read
