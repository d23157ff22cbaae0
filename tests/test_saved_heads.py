"""Configs and weights saved by an earlier version load to the same function: `tests/saved_heads/`
holds tiny models with scaled maps (bilinear, joint, the mixtures' and lightrnn's latents, from
scratch defaults, explicit `map_scale`s, both inits) and the logits the code of commit 4b7ea0f
computed for them (`make_fixture.py` wrote them); today's code must give the same logits."""

import json
import pathlib

import pytest
import torch
from safetensors.torch import load_file

from hf_outheads import OutHeadsConfig, OutHeadsForCausalLM

HERE = pathlib.Path(__file__).parent / "saved_heads"
CASES = sorted(p.name for p in HERE.iterdir() if (p / "config.json").exists())


def test_fixture_has_every_scaled_map_kind():
    assert {"bilinear", "joint", "mos", "doc", "lightrnn"} <= {json.loads((HERE / c / "config.json").read_text())
                                                             ["head_type"] for c in CASES}


@pytest.mark.parametrize("case", CASES)
def test_saved_model_loads_to_identical_logits(case):
    expected = load_file(HERE / "expected.safetensors")
    config = OutHeadsConfig.from_dict(json.loads((HERE / case / "config.json").read_text()))
    model = OutHeadsForCausalLM(config).eval()
    result = model.load_state_dict(load_file(HERE / case / "model.safetensors"), strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    with torch.no_grad():
        logits = model(input_ids=expected["input_ids"]).logits
    # the same: up to float32 rounding (the saving commit itself reproduces its logits to ~3e-8 only,
    # as CPU matrix products depend on memory alignment); a changed map is off by far more
    torch.testing.assert_close(logits, expected[case], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", CASES)
def test_a_saved_config_looks_its_head_up_once(case, monkeypatch):
    """`from_dict` (what `from_pretrained` reads config.json with) builds the saved options into the
    head's options object, looking the head up once; the model, its head and its tags read the class
    from the config's resolved options."""
    from head_cases import counted_lookups

    saved = json.loads((HERE / case / "config.json").read_text())
    lookups = counted_lookups(monkeypatch)
    model = OutHeadsForCausalLM(OutHeadsConfig.from_dict(saved))
    assert lookups == [saved["head_type"]] and type(model.head) is model.config.head_class
