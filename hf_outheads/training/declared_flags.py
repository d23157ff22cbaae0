"""A training command's flags built from its declared options (`hf_outheads.head_options`'
declarators), with the rules of `hf_outheads.tools.command_line`: a flag's value is YAML for every
option but a string one (`declared_values`), and is checked when the options object is built, as a
config file's are."""

from __future__ import annotations

import argparse
import dataclasses
import re

import yaml


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
