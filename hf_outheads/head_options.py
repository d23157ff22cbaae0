"""Head options: typed field declarations and the one place that checks and resolves them.

Every head's options are a dataclass of fields declared with `integer`, `number`, `probability`,
`flag`, `choice` or `pairs`; the declaration carries the type and the allowed range or choices.
An options object is checked when it is built: each field against its declaration (a ValueError
names the head and the option), an optional field left unset (None) staying unset. That object,
built once from what a run or a caller gave (`from_dict`), is what travels: a training run's
`HeadSpec` carries it, and `OutHeadsConfig(head_options=...)` takes it as it takes a dict.
`options.resolve(dims)` returns a complete copy: the fields left unset take the backbone's values
where the options read any (`backbone_defaults(dims)`), then the head's `scratch_defaults`
(`for_conversion()` first gives a converted head its `conversion_defaults`),
then the head's `complete(dims)` fills in the values that depend on the backbone (`joint_dim`,
lightrnn's table shape) and checks the options against each other and against the backbone.
`resolve` is idempotent: a resolved object (or its `dataclasses.asdict`, the saved config)
resolves to itself. `OutHeadsConfig.resolved_head_options` is where a model's options are
resolved; the model and its head receive that object (a head refuses options not resolved for
its sizes).
"""

from __future__ import annotations

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
    """What a field accepts. `kind`: "int", "number" (ints accepted) in `[low, high]`
    (`open_low` / `open_high` exclude a bound; `high` only together with `low`), "bool", "choice"
    (one of `choices`), "pairs": a non-empty list of `[integer, integer >= 1]` pairs, also given
    as a `{key: count}` dict whose keys may be integer strings (JSON object keys); `choices` then
    names the two members; "name": a string the head checks in `complete` (another head's type,
    whose list is the catalog's); "mapping": a dict with string keys (another head's options,
    which the head checks in `complete`), stored as a copy.
    `optional`: None is accepted (the head derives the value in `complete`)."""

    kind: str
    low: float | None = None
    high: float | None = None
    open_low: bool = False
    open_high: bool = False
    choices: tuple = ()  # "pairs": the names of a pair's two members
    optional: bool = False

    def describe(self) -> str:
        if self.kind == "bool":
            return "true or false"
        if self.kind == "name":
            return "a string"
        if self.kind == "mapping":
            return "a mapping of option names to values (a JSON object)"
        if self.kind == "pairs":
            key, count = self.choices
            return f"a non-empty list of [{key}, {count}] pairs (integers, each {count} >= 1)"
        if self.low is not None and self.high is not None:
            return f"in {'(' if self.open_low else '['}{self.low:g}, {self.high:g}{')' if self.open_high else ']'}"
        noun = "an integer" if self.kind == "int" else "a number"
        bound = "" if self.low is None else f" {'>' if self.open_low else '>='} {self.low:g}"
        return noun + bound + (" (or null for the default)" if self.optional else "")

    def accepts(self, value: Any) -> bool:
        if self.kind == "bool":
            return isinstance(value, bool)
        if self.kind == "choice":
            return isinstance(value, str) and value in self.choices
        if self.kind == "name":
            return isinstance(value, str)
        if self.kind == "mapping":
            return isinstance(value, dict) and all(isinstance(key, str) for key in value)
        if isinstance(value, bool) or not isinstance(value, int if self.kind == "int" else (int, float)):
            return False
        if not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.open_low else value < self.low):
            return False
        return self.high is None or (value < self.high if self.open_high else value <= self.high)

    def check(self, head_type: str, name: str, value: Any) -> Any:
        """`value`, checked (pairs: as a list of lists), or a ValueError naming head and option."""
        if value is None and self.optional:
            return None
        if self.kind == "pairs":
            pairs = _pairs(value)
            if pairs is not None:
                return pairs
        elif self.accepts(value):
            return dict(value) if self.kind == "mapping" else value
        elif self.kind == "choice":
            raise ValueError(f"Head '{head_type}': option '{name}'={value!r} is not one of {list(self.choices)}.")
        raise ValueError(f"Head '{head_type}': option '{name}' must be {self.describe()}, got {value!r}.")


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


def _declare(default: Any, spec: Spec) -> Any:
    if callable(default):
        return field(default_factory=default, metadata={"spec": spec})
    return field(default=default, metadata={"spec": spec})


def integer(default: int | None, minimum: int, optional: bool = False) -> Any:
    """An integer field `>= minimum` (None allowed when `optional`)."""
    return _declare(default, Spec("int", low=minimum, optional=optional))


def number(default: float | None, low: float | None = None, high: float | None = None, open_low: bool = False,
           open_high: bool = False, optional: bool = False) -> Any:
    """A real-valued field in `[low, high]` (ints accepted; `open_*` exclude a bound; None allowed
    when `optional`)."""
    return _declare(default, Spec("number", low=low, high=high, open_low=open_low, open_high=open_high,
                                  optional=optional))


def probability(default: float) -> Any:
    """A dropout-like rate in `[0, 1)`."""
    return number(default, 0.0, 1.0, open_high=True)


def flag(default: bool) -> Any:
    return _declare(default, Spec("bool"))


def choice(default: str, choices: Sequence[str]) -> Any:
    return _declare(default, Spec("choice", choices=tuple(choices)))


def pairs(default: Callable[[], list], names: tuple[str, str]) -> Any:
    """A list of `[integer, count >= 1]` pairs (or a `{key: count}` dict), stored as a list of lists;
    `names`: what the two members are, for messages."""
    return _declare(default, Spec("pairs", choices=names))


def name(default: str) -> Any:
    """A string field whose allowed values the head checks in `complete` (e.g. a head type of the catalog)."""
    return _declare(default, Spec("name"))


def mapping(default: Callable[[], dict]) -> Any:
    """A dict field with string keys (e.g. another head's options), checked further by the head's `complete`."""
    return _declare(default, Spec("mapping"))


def require_tied_width(head_type: str, dims: HeadDims, reason: str, alternatives: str) -> None:
    """Heads that score with `E` against the hidden state need `d == d_h`."""
    if dims.embed_dim != dims.hidden_dim:
        raise ValueError(f"Head '{head_type}' {reason}, so the embedding width d={dims.embed_dim} must equal the "
                         f"hidden width d_h={dims.hidden_dim}. Use {alternatives} for this backbone.")


@dataclass
class HeadOptions:
    """Base class of every head's hyper-parameters. Subclasses declare fields with the
    papers' defaults (`integer`, `number`, `choice`, ...) and may override `complete`."""

    head_type: ClassVar[str] = "head"
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
        """Options from a (config) dict; unknown keys are errors, values are checked (`__post_init__`)."""
        options = dict(options or {})
        valid = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(options) - set(valid))
        if unknown:
            raise ValueError(
                f"Unknown option(s) {unknown} for head '{cls.head_type}'. "
                f"Valid options: {valid or 'none (this head takes no options)'}."
            )
        return cls(**options)

    def __post_init__(self):
        """Every field checked against its declaration (a ValueError names the head and the
        option; a `pairs` field is stored as a list of lists); None stays only where optional."""
        for f in dataclasses.fields(self):
            spec = f.metadata.get("spec")
            if spec is not None:
                setattr(self, f.name, spec.check(self.head_type, f.name, getattr(self, f.name)))

    def with_defaults(self, defaults: dict[str, Any]) -> "HeadOptions":
        """A copy whose fields left unset (None) take `defaults`' values."""
        return dataclasses.replace(self, **{name: value for name, value in defaults.items() if getattr(self, name) is None})

    def for_conversion(self) -> "HeadOptions":
        """A copy with `conversion_defaults` for the fields left unset: a head started from a trained
        LM head (`from_backbone`)."""
        return self.with_defaults(self.conversion_defaults)

    def backbone_defaults(self, dims: HeadDims) -> dict[str, Any]:
        """Values of optional fields that follow the backbone (`dims`) when left unset. Default: none."""
        return {}

    def resolve(self, dims: HeadDims) -> "HeadOptions":
        """A complete copy: `backbone_defaults(dims)`, then `scratch_defaults` for the fields still
        unset, then `complete(dims)`."""
        resolved = self.with_defaults(self.backbone_defaults(dims)).with_defaults(self.scratch_defaults)
        resolved.complete(dims)
        resolved.resolved_for = dims
        return resolved

    def complete(self, dims: HeadDims) -> None:
        """Fill in backbone-dependent values (in place, on the copy `resolve` made) and check the
        options against each other and the backbone. Default: nothing."""
        return None

    def fail(self, message: str) -> None:
        raise ValueError(f"Head '{self.head_type}': {message}")
