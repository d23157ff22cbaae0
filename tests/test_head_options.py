"""Every head option is type- and range-checked in one place (`HeadOptions.resolve`): a bad
value is a ValueError naming the head and the option, never a raw TypeError, a silent
default or a silently converted value; resolved options are complete and resolve to themselves."""

import dataclasses

import pytest

from hf_outheads import HEAD_CLASSES, HeadDims, OutHeadsConfig
from head_cases import HEAD_CASES
from tiny import tiny_config

DIMS = HeadDims(vocab_size=99, embed_dim=32, hidden_dim=32, num_layers=2)

# (head, options, the option the error must name): each of these was accepted, silently changed or
# failed with a TypeError before options were checked in one place
BAD = [
    ("joint", {"joint_dim": "16"}, "joint_dim"),
    ("drill", {"dropout": "0.1"}, "dropout"),
    ("linear", {"sampled_fraction": None}, "sampled_fraction"),
    ("tied", {"sampled_fraction": "0.5"}, "sampled_fraction"),
    ("drill", {"residual_previous": "false"}, "residual_previous"),
    ("drill", {"depth": None}, "depth"),
    ("doc", {"components": [[1.7, 1]]}, "components"),
    ("doc", {"components": {"1.7": 1}}, "components"),
    ("doc", {"components": [[-1, 1.0]]}, "components"),
    ("doc", {"components": "[[-1, 2]]"}, "components"),
    ("doc", {"regularizer_weight": None}, "regularizer_weight"),
    ("doc", {"middle_layer_norm": "yes"}, "middle_layer_norm"),
    ("lightrnn", {"num_rows": 0}, "num_rows"),
    ("lightrnn", {"num_rows": -3}, "num_rows"),
    ("lightrnn", {"num_columns": 0}, "num_columns"),
    ("lightrnn", {"num_exclusive": 2.5}, "num_exclusive"),
    ("lightrnn", {"table_init": None}, "table_init"),
    ("mos", {"latent_dropout": "0.1"}, "latent_dropout"),
    ("mos", {"num_components": "3"}, "num_components"),
    ("mos", {"tied": "true"}, "tied"),
    ("mos", {"latent_dim": float("nan")}, "latent_dim"),
    ("bilinear", {"init": None}, "init"),
    ("joint", {"form": None}, "form"),
]


@pytest.mark.parametrize("head,options,option", BAD, ids=[f"{h}-{o}-{v!r}" for h, v, o in BAD])
def test_bad_option_values_name_the_head_and_the_option(head, options, option):
    with pytest.raises(ValueError) as error:
        OutHeadsConfig(text_config=tiny_config("gpt2"), head_type=head, head_options=options)
    assert f"Head '{head}'" in str(error.value) and f"'{option}'" in str(error.value), str(error.value)


def declared_fields(head_type):
    return dataclasses.fields(HEAD_CLASSES[head_type].Options)


@pytest.mark.parametrize("head_type", sorted(HEAD_CLASSES))
def test_every_declared_option_rejects_a_value_of_the_wrong_type(head_type):
    """Every field of every head: a string where a number or flag is wanted, a number where a
    choice is wanted, a list where anything else is wanted."""
    for f in declared_fields(head_type):
        spec = f.metadata["spec"]
        wrong = {"choice": [3, ["full"]], "text": [3, "x"]}.get(spec.kind, ["1", [1]])
        for value in wrong:
            with pytest.raises(ValueError) as error:
                HEAD_CLASSES[head_type].Options.from_dict({f.name: value}).resolve(DIMS)
            assert f"Head '{head_type}'" in str(error.value) and f"'{f.name}'" in str(error.value), (f.name, value)


@pytest.mark.parametrize("head_type", sorted(HEAD_CLASSES))
def test_resolved_options_are_complete_and_resolve_to_themselves(head_type):
    cls = HEAD_CLASSES[head_type]
    assert cls.Options.head_type == head_type  # errors name the right head
    assert all("spec" in f.metadata for f in declared_fields(head_type))  # every option is declared with a check
    given = cls.Options.from_dict(HEAD_CASES[head_type])
    before = dataclasses.asdict(given)
    resolved = given.resolve(DIMS)
    assert dataclasses.asdict(given) == before  # resolve returns a copy
    assert None not in [v for k, v in dataclasses.asdict(resolved).items() if k != "latent_dim"]  # None: embedding width
    assert resolved.resolve(DIMS) == resolved
    config = OutHeadsConfig(text_config=tiny_config("gpt2"), head_type=head_type, head_options=HEAD_CASES[head_type])
    assert config.head_options == dataclasses.asdict(resolved)
    assert cls.Options.from_dict(config.head_options).resolve(DIMS) == resolved


def test_integral_values_keep_their_meaning():
    """What was valid stays valid and means the same: ints for number options, JSON's string
    keys for doc's {layer: count}, explicit table sizes."""
    doc = HEAD_CLASSES["doc"].Options.from_dict({"components": {"-1": 2, "0": 1}, "regularizer_weight": 0}).resolve(DIMS)
    assert doc.components == [[-1, 2], [0, 1]] and doc.regularizer_weight == 0
    lightrnn = HEAD_CLASSES["lightrnn"].Options.from_dict({"num_exclusive": 0, "num_rows": 10}).resolve(DIMS)
    assert (lightrnn.num_exclusive, lightrnn.num_rows, lightrnn.num_columns) == (0, 10, 10)
    assert HEAD_CLASSES["linear"].Options.from_dict({"sampled_fraction": 1}).resolve(DIMS).sampled_fraction == 1


def test_options_are_resolved_once_in_the_config_and_handed_to_the_head(tmp_path):
    """The config resolves the options (`resolved_head_options`); the model's head receives that
    object; a head refuses options not resolved for its sizes; config.json holds the plain dict."""
    from hf_outheads import OutHeadsForCausalLM

    config = OutHeadsConfig(text_config=tiny_config("gpt2"), head_type="joint", head_options={"joint_dim": 8})
    resolved = config.resolved_head_options
    assert config.resolved_head_options is resolved and resolved.resolved_for is not None
    model = OutHeadsForCausalLM(config)
    assert model.head.options is resolved
    config.head_options["joint_dim"] = 4  # an edited dict is resolved again, not read stale
    assert config.resolved_head_options.joint_dim == 4 and model.head.options.joint_dim == 8
    with pytest.raises(ValueError, match=r"Head 'joint' got options not resolved.*options.resolve\(dims\)"):
        HEAD_CLASSES["joint"](HEAD_CLASSES["joint"].Options(), model.head.dims)
    model.save_pretrained(tmp_path)
    saved = (tmp_path / "config.json").read_text()
    assert "_resolved_head_options" not in saved and '"joint_dim": 4' in saved


@pytest.mark.parametrize("head,given", [("joint", {"joint_dim": 8}), ("mtp", {"head": "drill", "num_future": 2})])
def test_a_models_head_options_are_checked_and_resolved_once(head, given, tmp_path, monkeypatch):
    """A model's head options are checked once (each declared field, when the options
    object is built) and resolved once, by `OutHeadsConfig(...)` and again only by `from_pretrained`'s config; building
    the model, and the head, check nothing. `mtp`'s shared head gets the object its options resolved
    (`MTPOptions.complete`), not a dict turned into options again."""
    from hf_outheads import HeadOptions, OutHeadsForCausalLM

    calls, check, resolve = [], HeadOptions.__post_init__, HeadOptions.resolve  # building options checks each field
    monkeypatch.setattr(HeadOptions, "__post_init__", lambda self: (calls.append(("check", type(self))), check(self))[1])
    monkeypatch.setattr(HeadOptions, "resolve", lambda self, dims: (calls.append(("resolve", type(self))), resolve(self, dims))[1])
    classes = [HEAD_CLASSES[head].Options] + ([HEAD_CLASSES[given["head"]].Options] if head == "mtp" else [])
    once = sorted([(call, cls) for cls in classes for call in ("check", "resolve")], key=str)
    config = OutHeadsConfig(text_config=tiny_config("gpt2"), head_type=head, head_options=given)
    assert sorted(calls, key=str) == once
    calls.clear()
    model = OutHeadsForCausalLM(config)
    assert calls == [] and model.head.options is config.resolved_head_options
    if head == "mtp":
        assert model.head.shared.options is model.head.options.head_options
    model.save_pretrained(tmp_path)
    calls.clear()
    loaded = OutHeadsForCausalLM.from_pretrained(tmp_path)
    assert sorted(calls, key=str) == once and loaded.config.head_options == config.head_options


@pytest.mark.parametrize("head_type", sorted(HEAD_CLASSES))
def test_every_head_option_has_help_and_is_documented(head_type):
    """Each option's declaration carries its help (what it sets); docs/heads.md, which says why the
    defaults are what they are, names every option."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "docs" / "heads.md").read_text()
    for name, spec in HEAD_CLASSES[head_type].Options.declarations().items():
        assert spec.help.strip(), (head_type, name)
        assert f"`{name}`" in readme, (head_type, name)


def test_an_options_object_names_its_head():
    """A config built from a head's options object alone takes the head from it (`head_type`,
    `head_class`): one form, no name beside it; a name that is another head's is one clear line."""
    drill = HEAD_CLASSES["drill"]
    options = drill.Options(depth=2)
    config = OutHeadsConfig(text_config=tiny_config("gpt2"), head_options=options)
    assert (config.head_type, config.head_class, config.head_options["depth"]) == ("drill", drill, 2)
    assert OutHeadsConfig(text_config=tiny_config("gpt2"), head_type="drill", head_options=options).head_class is drill
    with pytest.raises(ValueError, match=r"^head_options are head 'drill''s options, not head 'mos''s: pass head "
                                         r"'mos''s options or a dict, or omit head_type\.$"):
        OutHeadsConfig(text_config=tiny_config("gpt2"), head_type="mos", head_options=options)
