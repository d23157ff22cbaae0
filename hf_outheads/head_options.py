"""Option declarations, for head and training options alike, and the one check they share.

An options class is a dataclass (`DeclaredOptions`) of fields declared with `integer`, `number`,
`probability`, `flag`, `choice`, `text`, `pairs`, `mapping` or `listing`: the declaration (`Spec`)
carries the type, the allowed range or choices and the help text. Building an options object
checks every field against its declaration (`Spec.check`, a ValueError naming the option), once,
whichever way the values came: a YAML file or the command line (`hf_outheads.training`, whose
parser is built from the same declarations), `OutHeadsConfig(...)`, a saved config.json.

Head options (`HeadOptions`) are then resolved once per model for the backbone's sizes:
`options.resolve(dims)` returns a complete copy, in which the fields left unset take the
backbone's values where the options read any (`backbone_defaults(dims)`), then the head's
`scratch_defaults` (`for_conversion()` first gives a converted head its `conversion_defaults`);
then the head's `complete(dims)` fills in the values that depend on the backbone (`joint_dim`,
lightrnn's table shape) and checks the options against each other and against the backbone.
`resolve` is idempotent: a resolved object (or its `dataclasses.asdict`, the saved config)
resolves to itself. `OutHeadsConfig.resolved_head_options` is where a model's options are
resolved; the model builds the head class the object names (`head_class`) and hands it that
object, which the head reads as it is.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Sequence


@dataclass(frozen=True)
class HeadDims:
    """Sizes a head is built for, and its backbone family's logit transform, read from the backbone
    config (see `backbones.head_dims`)."""

    vocab_size: int
    embed_dim: int  # d: width of the input embedding matrix E
    hidden_dim: int  # d_h: width of the backbone's final hidden state
    num_layers: int  # number of backbone layers (hidden_states has num_layers + 1 entries)
    # the family's LM head scores `logit_softcap * tanh(logit_scale * z / logit_softcap)` (softcap 0: `logit_scale * z`),
    # the defaults of the heads' options of the same names (`logit_transforms.LogitTransformOptions`)
    logit_scale: float = 1.0
    logit_softcap: float = 0.0


@dataclass(frozen=True)
class Spec:
    """An option's declaration: what it accepts and what it is (`help`). `kind`: "int", "number"
    (ints accepted) in `[low, high]` (`open_low` / `open_high` exclude a bound), "bool", "choice"
    (one of `choices`), "text" (a string; for a head, one it checks in `complete`), "pairs": a
    non-empty list of `[integer, integer >= 1]` pairs, also given as a `{key: count}` dict whose
    keys may be integer strings (JSON object keys), `choices` then naming the two members;
    "mapping": a dict with string keys, stored as a copy; "listing": a list of strings.
    `optional`: None is accepted (what it means, the help says)."""

    kind: str
    help: str
    low: float | None = None
    high: float | None = None
    open_low: bool = False
    open_high: bool = False
    choices: tuple = ()
    optional: bool = False

    def describe(self) -> str:
        """What the option accepts, in words (messages, `--help`)."""
        if self.kind in DESCRIPTIONS:
            return DESCRIPTIONS[self.kind]
        if self.kind == "choice":
            return f"one of {list(self.choices)}"
        if self.kind == "pairs":
            key, count = self.choices
            return f"a non-empty list of [{key}, {count}] pairs (integers, each {count} >= 1)"
        if self.low is not None and self.high is not None:
            return f"in {'(' if self.open_low else '['}{self.low:g}, {self.high:g}{')' if self.open_high else ']'}"
        noun = "an integer" if self.kind == "int" else "a number"
        return noun + ("" if self.low is None else f" {'>' if self.open_low else '>='} {self.low:g}")

    def accepts(self, value: Any) -> bool:
        if self.kind == "mapping":
            return isinstance(value, dict) and all(isinstance(key, str) for key in value)
        if self.kind == "listing":
            return isinstance(value, list) and all(isinstance(item, str) for item in value)
        if self.kind in TYPES:
            return isinstance(value, TYPES[self.kind])
        if self.kind == "choice":
            return isinstance(value, str) and value in self.choices
        if isinstance(value, bool) or not isinstance(value, int if self.kind == "int" else (int, float)):
            return False
        if not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.open_low else value < self.low):
            return False
        return self.high is None or (value < self.high if self.open_high else value <= self.high)

    def check(self, value: Any, label: str) -> Any:
        """`value`, checked (pairs: as a list of lists; a mapping or listing: a copy), or a ValueError
        that names the option as `label` says ("Head 'mos': option 'num_components'", "Option block_size")."""
        if value is None and self.optional:
            return None
        if self.kind == "pairs":
            pairs = _pairs(value)
            if pairs is not None:
                return pairs
        elif self.accepts(value):
            return TYPES[self.kind](value) if self.kind in ("mapping", "listing") else value
        elif self.kind == "choice":
            raise ValueError(f"{label}={value!r} is not one of {list(self.choices)}.")
        raise ValueError(f"{label} must be {self.describe()}, got {value!r}.")


TYPES = {"bool": bool, "text": str, "mapping": dict, "listing": list}  # the kinds that are one Python type
DESCRIPTIONS = {"bool": "true or false", "text": "a string", "mapping": "a mapping with string keys (a JSON object)",
                "listing": "a list of strings"}


def _whole(value: Any) -> int | None:
    """An int, or a string of one (JSON object keys); None for anything else (floats, bools)."""
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _pairs(value: Any) -> list[list[int]] | None:
    items = list(value.items()) if isinstance(value, dict) else value
    if not isinstance(items, (list, tuple)) or not items:
        return None
    if not all(isinstance(pair, (list, tuple)) and len(pair) == 2 for pair in items):
        return None
    pairs = [[_whole(key), count] for key, count in items]
    if any(key is None or isinstance(count, bool) or not isinstance(count, int) or count < 1 for key, count in pairs):
        return None
    return pairs


# The declarators: each makes a dataclass field whose metadata holds its `Spec`. A default that is
# a function (a list's, a dict's) is the field's default factory.

def _declare(default: Any, spec: Spec) -> Any:
    if callable(default):
        return field(default_factory=default, metadata={"spec": spec})
    return field(default=default, metadata={"spec": spec})


def integer(default: int | None, minimum: int, *, help: str, maximum: int | None = None, optional: bool = False) -> Any:
    """An integer in `[minimum, maximum]` (no upper bound by default)."""
    return _declare(default, Spec("int", help, low=minimum, high=maximum, optional=optional))


def number(default: float | None, low: float | None = None, high: float | None = None, *, help: str,
           open_low: bool = False, open_high: bool = False, optional: bool = False) -> Any:
    """A real number in `[low, high]` (ints accepted; `open_*` exclude a bound; `high` only together with `low`)."""
    return _declare(default, Spec("number", help, low=low, high=high, open_low=open_low, open_high=open_high,
                                  optional=optional))


def probability(default: float, *, help: str) -> Any:
    """A dropout-like rate in `[0, 1)`."""
    return number(default, 0.0, 1.0, open_high=True, help=help)


def flag(default: bool, *, help: str) -> Any:
    return _declare(default, Spec("bool", help))


def choice(default: str | None, choices: Sequence[str], *, help: str, optional: bool = False) -> Any:
    return _declare(default, Spec("choice", help, choices=tuple(choices), optional=optional))


def text(default: str | None, *, help: str, optional: bool = False) -> Any:
    """A string (a head checks its allowed values in `complete`, e.g. another head's type)."""
    return _declare(default, Spec("text", help, optional=optional))


def pairs(default: Callable[[], list], names: tuple[str, str], *, help: str) -> Any:
    """A list of `[integer, count >= 1]` pairs (or a `{key: count}` dict), stored as a list of lists;
    `names`: what the two members are, for messages."""
    return _declare(default, Spec("pairs", help, choices=names))


def mapping(default: Callable[[], dict], *, help: str) -> Any:
    """A dict with string keys (e.g. another head's options, which that head checks)."""
    return _declare(default, Spec("mapping", help))


def listing(default: Callable[[], list], *, help: str) -> Any:
    """A list of strings."""
    return _declare(default, Spec("listing", help))


class DeclaredOptions:
    """Base of a dataclass of options declared with the declarators above: building one checks each
    field against its declaration (`Spec.check`), the one check every way in shares (a config file,
    the command line, `OutHeadsConfig(...)`, a saved config.json). A ValueError names the option
    as `label` says."""

    @classmethod
    def declarations(cls) -> dict[str, Spec]:
        return {f.name: f.metadata["spec"] for f in dataclasses.fields(cls) if "spec" in f.metadata}

    def label(self, name: str) -> str:
        return f"Option {name}"

    def __post_init__(self):
        for name, spec in self.declarations().items():
            object.__setattr__(self, name, spec.check(getattr(self, name), self.label(name)))


def require_tied_width(head_type: str, dims: HeadDims, reason: str, alternatives: str) -> None:
    """Heads that score with `E` against the hidden state need `d == d_h`."""
    if dims.embed_dim != dims.hidden_dim:
        raise ValueError(f"Head '{head_type}' {reason}, so the embedding width d={dims.embed_dim} must equal the "
                         f"hidden width d_h={dims.hidden_dim}. Use {alternatives} for this backbone.")


@dataclass
class HeadOptions(DeclaredOptions):
    """Base class of every head's hyper-parameters. Subclasses declare fields with the
    papers' defaults (`integer`, `number`, `choice`, ...) and may override `complete`."""

    head_type: ClassVar[str] = "head"
    # the registered head class these are the options of (set by `head_interface.register_head`): what a model
    # builds from its resolved options, without looking `head_type` up in the registry again
    head_class: ClassVar[type | None] = None
    # values of optional fields left unset (None): `scratch_defaults` for a head trained from
    # scratch (filled in by `resolve`), `conversion_defaults` for one started from a trained LM
    # head (`from_backbone`, `for_conversion`), where the two differ by measurement
    scratch_defaults: ClassVar[dict[str, Any]] = {}
    conversion_defaults: ClassVar[dict[str, Any]] = {}
    # values of fields that a config saved before the field existed lacks: the behaviour of the
    # version that saved it (`for_saved`, applied when a config.json is loaded; a class's entries
    # are added to its bases')
    saved_defaults: ClassVar[dict[str, Any]] = {}
    # fields an earlier version declared and a saved config may still state, which this head never
    # read: dropped when a config.json is loaded (`for_saved`); still errors anywhere else
    retired_options: ClassVar[tuple[str, ...]] = ()
    # the sizes `resolve` completed this object for (set on the copy it returns); None: not resolved
    resolved_for: ClassVar[HeadDims | None] = None

    def label(self, name: str) -> str:
        return f"Head '{self.head_type}': option '{name}'"

    @classmethod
    def for_saved(cls, options: dict[str, Any] | None) -> dict[str, Any]:
        """Saved `options` (a config.json's `head_options`) with `saved_defaults` for the fields it
        lacks, without `retired_options`."""
        defaults = {}  # each class's own `saved_defaults`, a subclass's over its bases'
        for klass in reversed(cls.__mro__):
            defaults.update(vars(klass).get("saved_defaults", {}))
        options = {**defaults, **dict(options or {})}
        return {name: value for name, value in options.items() if name not in cls.retired_options}

    @classmethod
    def from_dict(cls, options: dict[str, Any] | None) -> "HeadOptions":
        """Options from a (config) dict, each checked against its declaration; unknown keys are errors."""
        options = dict(options or {})
        valid = list(cls.declarations())
        unknown = sorted(set(options) - set(valid))
        if unknown:
            raise ValueError(
                f"Unknown option(s) {unknown} for head '{cls.head_type}'. "
                f"Valid options: {valid or 'none (this head takes no options)'}."
            )
        return cls(**options)

    def with_defaults(self, defaults: dict[str, Any]) -> "HeadOptions":
        """A copy whose fields left unset (None) take `defaults`' values: the heads' own defaults,
        not checked again (`complete` checks what depends on them)."""
        copied = copy.copy(self)
        for name, value in defaults.items():
            if getattr(copied, name) is None:
                setattr(copied, name, value)
        return copied

    def for_conversion(self) -> "HeadOptions":
        """A copy with `conversion_defaults` for the fields left unset: a head started from a trained
        LM head (`from_backbone`)."""
        return self.with_defaults(self.conversion_defaults)

    def backbone_defaults(self, dims: HeadDims) -> dict[str, Any]:
        """Values of optional fields that follow the backbone (`dims`) when left unset. Default: none."""
        return {}

    def resolve(self, dims: HeadDims) -> "HeadOptions":
        """A complete copy: `backbone_defaults(dims)`, then `scratch_defaults` for the fields still
        unset, then `complete(dims)`. The fields are not checked again: they were when this object
        was built."""
        resolved = self.with_defaults({**self.scratch_defaults, **self.backbone_defaults(dims)})
        resolved.complete(dims)
        resolved.resolved_for = dims
        return resolved

    def complete(self, dims: HeadDims) -> None:
        """Fill in backbone-dependent values (in place, on the copy `resolve` made) and check the
        options against each other and the backbone. Default: nothing."""
        return None

    def fail(self, message: str) -> None:
        raise ValueError(f"Head '{self.head_type}': {message}")
