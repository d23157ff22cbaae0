"""Bad input fails at once with a message that says what is wrong; no checkpoint loads silently
with random head weights."""

import json
import re

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, ElectraConfig

from hf_outheads import HEAD_CLASSES, HeadDims, OutHeadsConfig, OutHeadsForCausalLM
from hf_outheads.head_tied import TiedHead
from tiny import batch, tiny_config


def electra_config():
    """A backbone whose embedding width d=16 differs from its hidden width d_h=32."""
    return ElectraConfig(embedding_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=64, vocab_size=99, max_position_embeddings=64, is_decoder=True)


def test_unknown_head_type_lists_valid_ones():
    with pytest.raises(ValueError, match="Unknown head type 'nope'") as error:
        OutHeadsConfig(text_config=tiny_config("gpt2"), head_type="nope")
    assert all(repr(name) in str(error.value) for name in HEAD_CLASSES)


def test_unknown_head_option_is_named():
    with pytest.raises(ValueError, match=r"Unknown option\(s\) \['widht'\] for head 'bilinear'"):
        OutHeadsConfig(text_config=tiny_config("gpt2"), head_type="bilinear", head_options={"widht": 3})


# (head, option, invalid value); more in tests/test_head_options.py
BAD_SIZES = [("joint", "joint_dim", 0), ("joint", "joint_dim", -4), ("drill", "depth", -1),
             ("mos", "num_components", 0), ("mos", "num_components", -2),
             ("doc", "components", [[-1, 0]]), ("doc", "components", [[-1, -3]])]


@pytest.mark.parametrize("head,option,value", BAD_SIZES, ids=[f"{h}-{o}-{v}" for h, o, v in BAD_SIZES])
def test_zero_or_negative_sizes_raise(head, option, value):
    with pytest.raises(ValueError, match=f"'{option}") as error:
        OutHeadsConfig(text_config=tiny_config("gpt2"), head_type=head, head_options={option: value})
    assert f"'{head}'" in str(error.value)


def test_tied_needs_equal_widths():
    with pytest.raises(ValueError, match=r"d=16 must equal the hidden width d_h=32"):
        TiedHead.Options().resolve(HeadDims(vocab_size=99, embed_dim=16, hidden_dim=32, num_layers=2))
    TiedHead.Options().resolve(HeadDims(vocab_size=99, embed_dim=32, hidden_dim=32, num_layers=2))


def test_tied_on_backbone_with_narrow_embeddings_raises_but_bilinear_works():
    with pytest.raises(ValueError, match="'tied'.*d=16.*d_h=32"):
        OutHeadsConfig(text_config=electra_config(), head_type="tied")
    model = OutHeadsForCausalLM(OutHeadsConfig(text_config=electra_config(), head_type="bilinear")).eval()
    assert model.head.map.weight.shape == (16, 32)
    assert model(**batch("gpt2")).logits.shape == (2, 7, 99)


def test_vocab_size_must_match_backbone():
    with pytest.raises(ValueError, match="vocab_size=100 does not match the backbone's vocab_size=99"):
        OutHeadsConfig(text_config=tiny_config("gpt2"), vocab_size=100)
    assert OutHeadsConfig(text_config=tiny_config("gpt2"), vocab_size=99).vocab_size == 99


@pytest.fixture
def saved_linear(tmp_path):
    torch.manual_seed(0)
    OutHeadsForCausalLM(OutHeadsConfig(text_config=tiny_config("llama"), head_type="linear")).save_pretrained(tmp_path)
    return tmp_path


def edit_weights(folder, edit):
    weights = load_file(folder / "model.safetensors")
    edit(weights)
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})


def set_head_type(folder, head_type):
    config = json.loads((folder / "config.json").read_text())
    config["head_type"] = head_type
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("loader", [OutHeadsForCausalLM, AutoModelForCausalLM])
def test_missing_head_weight_raises(saved_linear, loader):
    edit_weights(saved_linear, lambda w: w.pop("head.bias"))
    with pytest.raises(ValueError, match=r"missing_keys.*head\.bias"):
        loader.from_pretrained(saved_linear)


def test_missing_backbone_weight_raises(saved_linear):
    edit_weights(saved_linear, lambda w: w.pop("backbone.norm.weight"))
    with pytest.raises(ValueError, match=r"backbone\.norm\.weight"):
        OutHeadsForCausalLM.from_pretrained(saved_linear)


def test_misshaped_head_weight_raises(saved_linear):
    edit_weights(saved_linear, lambda w: w.update({"head.bias": torch.zeros(50)}))
    with pytest.raises(ValueError, match=r"mismatched_keys.*head\.bias.*50"):
        OutHeadsForCausalLM.from_pretrained(saved_linear)
    # asked for explicitly, mis-shaped weights are re-initialised (transformers' behaviour)
    model = OutHeadsForCausalLM.from_pretrained(saved_linear, ignore_mismatched_sizes=True)
    assert model.head.bias.shape == (99,)


@pytest.mark.parametrize("wrong_type,problem", [("bilinear", "missing_keys"), ("tied", "unexpected_keys")])
def test_checkpoint_of_another_head_type_raises(saved_linear, wrong_type, problem):
    set_head_type(saved_linear, wrong_type)
    with pytest.raises(ValueError, match=rf"head '{wrong_type}'.*{problem}"):
        AutoModelForCausalLM.from_pretrained(saved_linear)


def test_intact_checkpoint_loads(saved_linear):
    model, info = OutHeadsForCausalLM.from_pretrained(saved_linear, output_loading_info=True)
    assert not any(info[key] for key in ("missing_keys", "unexpected_keys", "mismatched_keys"))


@pytest.mark.parametrize("saved", [[1, 2], "depth: 2", 3])
def test_a_saved_config_whose_head_options_are_not_a_mapping_is_named(saved_linear, saved, tmp_path_factory):
    """A hand-edited config.json; loading names `head_options`, and so does the
    export command, in one line with status 2."""
    from hf_outheads.tools.export import main as export

    config = json.loads((saved_linear / "config.json").read_text())
    (saved_linear / "config.json").write_text(json.dumps({**config, "head_options": saved}))
    message = rf"head_options must be a mapping of option: value \(a JSON object in config.json\).*got {re.escape(repr(saved))}"
    with pytest.raises(ValueError, match=message):
        AutoModelForCausalLM.from_pretrained(saved_linear)
    with pytest.raises(ValueError, match=message):
        OutHeadsConfig(text_config=tiny_config("gpt2"), head_options=saved)
    plain = tmp_path_factory.mktemp("export") / "plain"
    with pytest.raises(SystemExit, match=rf"^Not exported: {re.escape(str(saved_linear))} holds no model \({message}") as refused:
        export([str(saved_linear), str(plain)])
    assert refused.value.code == 2 and not plain.exists()
