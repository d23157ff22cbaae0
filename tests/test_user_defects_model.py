"""Model-level defects a new user met (issue 26): wrong-class loading, transformers' deprecated
`past_key_values` name, Trainer's label names, the heads' dropout under the ecosystem's switches."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch

from tiny import batch, model_class, tiny_model, tiny_original


@pytest.mark.parametrize("backbone", ["llama", "bart"])
def test_no_future_warning_from_convert_forward_generate_save_load(backbone, tmp_path):
    """transformers >= 5.24 names the cache `cache`; passing `past_key_values=` to the backbone
    warned (FutureWarning) on every forward, and generate passed both names."""
    cls = model_class(backbone)
    data = batch(backbone)
    prompt = data["input_ids"][:, :3]
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        model = cls.from_backbone(tiny_original(backbone), head_type="drill").eval()
        with torch.no_grad():
            assert model(**data).loss is not None
            prefix = model(**({"input_ids": prompt} if backbone == "llama" else data), use_cache=True)
        assert prefix.cache is not None
        greedy = model.generate(prompt, max_new_tokens=4, do_sample=False)
        model.generate(prompt, max_new_tokens=4, num_beams=2, do_sample=False)
        model.generate(prompt, max_new_tokens=4, do_sample=True, top_k=5)
        assert torch.equal(greedy, model.generate(prompt, max_new_tokens=4, do_sample=False, use_cache=False))
        model.save_pretrained(tmp_path)
        cls.from_pretrained(tmp_path)


def test_forward_takes_cache_and_the_old_name_with_a_warning():
    """`cache` is a forward parameter (as in transformers' models); `past_key_values=` still
    works, with transformers' deprecation warning."""
    model = tiny_model("llama", "linear")
    assert "cache" in inspect.signature(model.forward).parameters
    ids = batch("llama")["input_ids"]
    with torch.no_grad():
        prefix = model(input_ids=ids[:, :4], use_cache=True)
        new = model(input_ids=ids[:, 4:], cache=prefix.cache).logits
        prefix = model(input_ids=ids[:, :4], use_cache=True)
        with pytest.warns(FutureWarning, match="past_key_values"):
            old = model(input_ids=ids[:, 4:], past_key_values=prefix.cache).logits
    torch.testing.assert_close(new, old)
