"""How every command (`hf-outheads train | export | mtp-distill | quickstart`) reads its command line
and refuses what it cannot run, as argparse and transformers' `HfArgumentParser` do:

- `--a_b` and `--a-b` are one option (HfArgumentParser, TRL's parser and `hf-outheads export
  --text-file` accept both); no abbreviations;
- the options are declared (`hf_outheads.head_options`' declarators) and their flags are built from
  the declarations (`add_declared`): a flag's value is YAML for every option but a string one
  (`declared_values`), and is checked when the options object is built, as a config file's are;
- `--help` shows each option's help and default;
- bad input (an option, a config or data file, the folders named) is refused before anything is
  written, in one line on stderr, with exit status 2: argparse's status for a usage error
  (`refuse`). A run that starts and then fails (a non-finite loss, a full disk) exits 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from pathlib import Path

import yaml


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


def program(script: str) -> str:
    """The name of the running command, for its usage and error lines: `hf-outheads <command>` under
    the installed command (`hf_outheads.tools.cli` names it in `sys.argv[0]`, as argparse reads it), else
    the script's file name (`train.py`), as argparse names a script run by path or with `-m`."""
    return sys.argv[0] if sys.argv[0].startswith("hf-outheads ") else Path(script).name


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


class YamlLoader(yaml.SafeLoader):
    """PyYAML's safe loader, reading `1e-3` as a number, as YAML 1.2 does (PyYAML follows YAML 1.1,
    whose floats need a dot: `1.0e-3`), so that a learning rate is a number however it is written."""


YamlLoader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
                                 list("-+0123456789"))


def yaml_value(text: str, where: str):
    """`text` read as YAML; a ValueError naming `where` and the YAML problem, in one line."""
    try:
        return yaml.load(text, Loader=YamlLoader)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        problem += " (YAML indents with spaces, not tabs)" if "'\\t'" in problem else ""
        raise ValueError(f"{where} is not valid YAML: {problem}{at}.") from None


STRING_KINDS = ("text", "choice")  # a flag's value is taken as written; every other kind's is read as YAML


def add_declared(parser, options_class) -> None:
    """A `--name` flag for every option `options_class` declares (`hf_outheads.head_options`), with
    its help and default; a flag alone (`--flag`) is true, as in `HfArgumentParser`. The values are
    checked when the options object is built (`declared_values`), not here."""
    for name, f in ((f.name, f) for f in dataclasses.fields(options_class) if "spec" in f.metadata):
        spec = f.metadata["spec"]
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        flag = {"nargs": "?", "const": "true"} if spec.kind == "bool" else {}
        shown = default if isinstance(default, str) and default else repr(default)  # outputs, '', None, {}
        text = f"{spec.help} (default: {shown})".replace("%", "%%")  # argparse formats help with %
        parser.add_argument(f"--{name}", default=argparse.SUPPRESS, help=text, **flag)


def declared_values(options_class, flags: dict) -> dict:
    """The values of `options_class`'s options among the parsed `flags`: a string option's as given
    (`null` or `None`: None), any other read as YAML (`--head_options '{depth: 4}'`, `--max_steps null`)."""
    values = {}
    for name, spec in options_class.declarations().items():
        if name in flags:
            raw = flags[name]
            if spec.kind in STRING_KINDS or not isinstance(raw, str):
                values[name] = None if raw in ("null", "None") else raw
            else:
                values[name] = yaml_value(raw, f"--{name} {raw}")
    return values
