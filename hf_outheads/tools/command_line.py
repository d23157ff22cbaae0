"""How every command (`hf-outheads train | export | gguf | mtp-distill | quickstart`) reads its command
line and refuses what it cannot run, as argparse and transformers' `HfArgumentParser` do:

- `--a_b` and `--a-b` are one option (HfArgumentParser, TRL's parser and `hf-outheads export
  --text-file` accept both); no abbreviations;
- a training command's options are declared (`hf_outheads.head_options`' declarators) and their
  flags are built from the declarations (`hf_outheads.training.declared_flags`);
- `--help` shows each option's help and default;
- a model named on the command line is a folder, or a Hub id (`namespace/name`) only where it cannot
  be a local path (`looks_local`), so a mistyped folder is said to be missing, never looked up;
- bad input (an option, a config or data file, the folders named) is refused before anything is
  written, in one line on stderr, with exit status 2: argparse's status for a usage error
  (`refuse`). A run that starts and then fails (a non-finite loss, a full disk) exits 1.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from pathlib import Path

REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # the Hub's namespace/name


def looks_local(name: str) -> bool:
    """True when `name` can only mean a local path: not `namespace/name`, or written as a path
    (absolute, `./`, `~`), or its first part is a folder here (`outputs/quickstart_lm`)."""
    return (not REPO_ID.fullmatch(name) or name.startswith((".", "~", os.sep))
            or Path(name.split("/")[0]).is_dir())


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


class DeepSpeedCpuNotice(logging.Filter):
    """DeepSpeed's "Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to
    detect it." (its accelerator auto-detection, logged as a warning when it finds no GPU)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Setting accelerator to CPU")


def quiet_deepspeed_cpu_notice(deepspeed_used: bool = False) -> None:
    """Where DeepSpeed is installed (the `deepspeed` and `dev` extras), accelerate and transformers import
    it (e.g. `Accelerator.unwrap_model`, a model's `from_pretrained`), and on a machine without GPU it warns
    that it set its accelerator to CPU, also where nothing uses DeepSpeed. Unless `deepspeed_used`, that
    one message is dropped from DeepSpeed's logger ("DeepSpeed"; a filter, which DeepSpeed's own logger
    setup keeps)."""
    if not deepspeed_used:
        logging.getLogger("DeepSpeed").addFilter(DeepSpeedCpuNotice())
