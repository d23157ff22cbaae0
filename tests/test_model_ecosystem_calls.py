"""The model as transformers' and TRL's conventions call it: the cache under its current and its
deprecated name, the Auto class that fits a folder (a wrong one named), Trainer's label names,
metrics and inferred task, the ecosystem's dropout switch reaching the head, a config without a
backbone refused, a left-padded row generating as it does alone."""

from __future__ import annotations

import contextlib
import inspect
import warnings

import pytest
import torch

from transformers import AutoModel, AutoModelForCausalLM, AutoModelForSeq2SeqLM

from hf_outheads import OutHeadsConfig, OutHeadsForCausalLM, OutHeadsForSeq2SeqLM
from hf_outheads.compat import CACHE  # the outputs' cache field: `cache` from transformers 5.24, `past_key_values` before
from tiny import batch, model_class, tiny_config, tiny_model, tiny_original


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
        assert getattr(prefix, CACHE) is not None
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
        new = model(input_ids=ids[:, 4:], cache=getattr(prefix, CACHE)).logits
        prefix = model(input_ids=ids[:, :4], use_cache=True)
        warned = pytest.warns(FutureWarning, match="past_key_values") if CACHE == "cache" else contextlib.nullcontext()
        with warned:  # (before transformers 5.24 `past_key_values` is its generate's own name: no warning)
            old = model(input_ids=ids[:, 4:], past_key_values=getattr(prefix, CACHE)).logits
    torch.testing.assert_close(new, old)


@pytest.mark.parametrize("backbone,auto,right", [("bart", AutoModelForCausalLM, "OutHeadsForSeq2SeqLM"),
                                                 ("t5", OutHeadsForCausalLM, "OutHeadsForSeq2SeqLM"),
                                                 ("llama", AutoModelForSeq2SeqLM, "OutHeadsForCausalLM"),
                                                 ("gpt2", OutHeadsForSeq2SeqLM, "OutHeadsForCausalLM")])
def test_wrong_class_fails_at_load_naming_the_right_one(backbone, auto, right, tmp_path):
    """Both classes share OutHeadsConfig, so the Auto classes took either; the wrong one loaded
    and failed at the first forward (`no attribute 'hidden_states'`)."""
    tiny_model(backbone, "tied").save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=f"load it with {right}"):
        auto.from_pretrained(tmp_path)
    assert type(AutoModel.from_pretrained(tmp_path)).__name__ == right  # the saved architectures pick it


@pytest.mark.parametrize("backbone", ["gpt2", "t5", "bart"])
def test_automodel_from_config_builds_the_class_of_the_backbone(backbone):
    """AutoModel is registered with both classes (a tuple), from which transformers
    picks by `config.architectures`, else the first (causal) one, which refused an encoder-decoder
    backbone. A config now names the class of its backbone kind (a given one is kept). With
    `architectures=None` transformers' pick fails on `None` for its own tuple-mapped configs too
    (FunnelConfig): upstream."""
    for extra in ({}, {"architectures": []}):
        config = OutHeadsConfig(text_config=tiny_config(backbone), head_type="linear", **extra)
        assert type(AutoModel.from_config(config)) is model_class(backbone)
    config = OutHeadsConfig(text_config=tiny_config(backbone), architectures=["SomethingElse"])
    assert config.architectures == ["SomethingElse"]


@pytest.mark.parametrize("backbone", ["bart", "llama"])
def test_wrong_class_fails_when_built_or_converted(backbone):
    wrong = OutHeadsForCausalLM if backbone == "bart" else OutHeadsForSeq2SeqLM
    with pytest.raises(ValueError, match=f"`{backbone}`.*load it with {model_class(backbone).__name__}"):
        wrong(OutHeadsConfig(text_config=tiny_config(backbone), head_type="linear"))
    with pytest.raises(ValueError, match=f"load it with {model_class(backbone).__name__}"):
        wrong.from_backbone(tiny_original(backbone))


@pytest.mark.parametrize("backbone", ["llama", "bart"])
def test_trainer_evaluate_reports_eval_loss_and_calls_compute_metrics(backbone, tmp_path):
    """Trainer takes every forward parameter named `*label*` as a label name; a `shift_labels`
    parameter made it wait for two label columns, so a batch with `labels` had none: no
    eval_loss, no compute_metrics. transformers' causal LMs take `shift_labels` in kwargs."""
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    data = batch(backbone, batch_size=4)
    dataset = Dataset.from_dict({key: value.tolist() for key, value in data.items()})
    calls = []

    def compute_metrics(prediction):
        calls.append(prediction)
        return {"seen": float(len(prediction.label_ids))}

    args = TrainingArguments(output_dir=str(tmp_path), per_device_eval_batch_size=2, report_to=[], use_cpu=True)
    model = model_class(backbone).from_backbone(tiny_original(backbone), head_type="drill")
    trainer = Trainer(model=model, args=args, eval_dataset=dataset, compute_metrics=compute_metrics)
    assert trainer.label_names == ["labels"]
    metrics = trainer.evaluate()
    with torch.no_grad():
        expected = model.eval()(**data).loss.item()
    assert metrics["eval_loss"] == pytest.approx(expected, rel=1e-4)
    assert len(calls) == 1 and metrics["eval_seen"] == 4.0



@pytest.mark.parametrize("head", ["tied", "doc"])
def test_trainers_use_cache_reaches_the_backbone_so_packed_batches_score_as_padded(head, tmp_path):
    """Trainer sets `model.config.use_cache = False`; it stayed on the composite
    config, the backbone (reading `text_config.use_cache`) built a KV cache in training, and
    transformers then dropped the packed-sequence mask of `DataCollatorWithFlattening`: the packed
    loss differed from the padded batch's (plain `LlamaForCausalLM`: equal). Generation still
    caches (its `generation_config.use_cache`)."""
    from transformers import DataCollatorWithFlattening, Trainer, TrainingArguments

    model = tiny_model("llama", head, {"components": [[-1, 2], [1, 1]]} if head == "doc" else None)
    Trainer(model=model, args=TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True))
    assert model.config.use_cache is False and model.config.text_config.use_cache is False
    rows = [list(range(3, 10)), list(range(10, 15)), list(range(20, 29))]
    packed = DataCollatorWithFlattening(return_tensors="pt")([{"input_ids": row} for row in rows])
    width = max(map(len, rows))
    ids = torch.tensor([row + [0] * (width - len(row)) for row in rows])
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in rows])
    with torch.no_grad():
        padded_loss = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
        torch.testing.assert_close(model(**packed).loss, padded_loss, rtol=1e-5, atol=1e-6)
        assert getattr(model(input_ids=ids[:, :3]), CACHE) is None
    generated = model.generate(ids[:1, :3], max_new_tokens=3, do_sample=False, return_dict_in_generate=True)
    assert getattr(generated, CACHE) is not None and getattr(generated, CACHE).get_seq_length() > 0

DROPOUT_CASES = [("drill", {"dropout": 0.3}), ("drill", {"dropout": 0.3, "dropout_kind": "locked"}),
                 ("drill", {"dropout": 0.3, "dropout_position": "output"}), ("mos", {"latent_dropout": 0.3}),
                 ("doc", {"latent_dropout": 0.3, "dropout_kind": "standard"}), ("lightrnn", {"latent_dropout": 0.3})]


@pytest.mark.parametrize("head,options", DROPOUT_CASES, ids=[f"{h}-{'-'.join(map(str, o.values()))}" for h, o in DROPOUT_CASES])
def test_disable_dropout_in_model_reaches_the_heads_dropout(head, options):
    """TRL's `disable_dropout_in_model` (DPO's default) sets `p = 0` on every nn.Dropout; drill's
    label dropout and the mixtures' latent dropout were no nn.Dropout and stayed on."""
    from trl.trainer.utils import disable_dropout_in_model

    model = tiny_model("llama", head, options).train()
    assert not any("dropout" in key for key in model.state_dict())  # no state: checkpoints unchanged
    data = batch("llama")
    torch.manual_seed(0)
    assert not torch.equal(model(**data).loss, model(**data).loss)  # the head's dropout is on
    disable_dropout_in_model(model)
    torch.manual_seed(0)
    assert torch.equal(model(**data).loss, model(**data).loss)
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(**data).logits, model.train()(**data, return_logits=True).logits)


def test_config_with_head_type_but_no_backbone_is_refused_when_built(tmp_path):
    """It could be built and saved, then from_pretrained refused the folder; the argument-less
    config that transformers builds for its defaults stays possible."""
    for kwargs in ({"head_type": "linear"}, {"head_options": {"depth": 2}}):
        with pytest.raises(ValueError, match="no text_config .*from_backbone"):
            OutHeadsConfig(**kwargs)
    assert OutHeadsConfig().head_type is None and OutHeadsConfig().text_config is None
    config = OutHeadsConfig(text_config=tiny_config("gpt2"))
    assert config.head_type == "tied"  # the default head once there is a backbone
    config.save_pretrained(tmp_path)
    assert OutHeadsConfig.from_pretrained(tmp_path).head_type == "tied"


@pytest.mark.parametrize("converted", [False, True], ids=["fresh", "converted"])
def test_lightrnn_left_padded_row_generates_as_alone(converted):
    """Lengths 3 and 6, tiny Llama: the code table's path scores each
    position alone (no padding reaches the head: generation keeps the last position), so a
    padded row's log-probabilities equal the unpadded row's to float rounding, with the same
    masked (-inf) codes, and greedy picks the same tokens unless two words tie within it."""
    model = (OutHeadsForCausalLM.from_backbone(tiny_original("llama"), head_type="lightrnn").eval() if converted
             else tiny_model("llama", "lightrnn"))
    for seed in (3, 4, 5):
        ids = torch.randint(3, 99, (2, 6), generator=torch.Generator().manual_seed(seed))
        mask = torch.ones_like(ids)
        mask[0, :3] = 0
        settings = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=0, output_scores=True,
                        return_dict_in_generate=True)
        padded = model.generate(input_ids=ids.masked_fill(mask == 0, 0), attention_mask=mask, **settings)
        alone = model.generate(input_ids=ids[:1, 3:], **settings)
        assert torch.equal(padded.sequences[0, -6:], alone.sequences[0, -6:])
        for in_batch, single in zip(padded.scores, alone.scores):
            assert torch.equal(torch.isfinite(in_batch[0]), torch.isfinite(single[0]))
            torch.testing.assert_close(in_batch[0], single[0], atol=1e-5, rtol=0)


def test_trainer_infers_the_task_of_both_model_classes(tmp_path):
    from transformers import Trainer, TrainingArguments
    from transformers.modelcard import TrainingSummary

    from tiny import tiny_model

    for family, task in (("gpt2", "text-generation"), ("t5", "text2text-generation")):
        args = TrainingArguments(output_dir=str(tmp_path / family), report_to=[], use_cpu=True, save_strategy="no")
        summary = TrainingSummary.from_trainer(Trainer(model=tiny_model(family, "tied"), args=args))
        assert summary.tasks == task
