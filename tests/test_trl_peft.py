"""TRL's SFT and DPO trainers and PEFT adapters, on every head (tiny models, a few steps).

TRL replaces `model.forward` by a fused LM head (`add_fused_lm_head`) that would multiply the
backbone's last hidden state by `get_output_embeddings().weight`; the model answers that call
through its head instead (`hf_outheads.model_io`). PEFT adapters on the input embeddings
are seen by the heads that read `E`."""

import pytest
import torch

trl = pytest.importorskip("trl")
peft = pytest.importorskip("peft")

from datasets import Dataset  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast  # noqa: E402
from trl.trainer.utils import add_fused_lm_head  # noqa: E402

from hf_outheads import OutHeadsForCausalLM  # noqa: E402
from hf_outheads.compat import CHECKPOINTING_ARGUMENT  # noqa: E402
from head_cases import HEAD_CASES  # noqa: E402
from tiny import VOCAB, batch, tiny_model  # noqa: E402

HEADS = sorted(HEAD_CASES)
# TRL 1.16's trainers call transformers' deprecated `gradient_checkpointing_*` / `is_gradient_checkpointing`
# names on the model (inherited from PreTrainedModel): their warnings are TRL's, not this package's
pytestmark = pytest.mark.filterwarnings("ignore:`(is_)?gradient_checkpointing\\w*` is deprecated:FutureWarning")

TRAINING = dict(max_steps=2, per_device_train_batch_size=2, learning_rate=1e-2, report_to=[], save_strategy="no",
                logging_steps=1, use_cpu=True, bf16=False, disable_tqdm=True, seed=0,
                **{CHECKPOINTING_ARGUMENT: True})  # TRL's default, under its current name (not the deprecated one)


@pytest.fixture(scope="module")
def tokenizer():
    """Word-level tokenizer over the tiny vocabulary, built offline: `w<i>` is id i."""
    words = ["<pad>", "<s>", "</s>", "<unk>"] + [f"w{i}" for i in range(4, VOCAB)]
    model = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    model.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=model, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")


def text(seed, length=8):
    g = torch.Generator().manual_seed(seed)
    return " ".join(f"w{i}" for i in torch.randint(4, VOCAB, (length,), generator=g).tolist())


def build(head, backbone="llama"):
    return tiny_model(backbone, head, HEAD_CASES[head]).train()


def head_state(model):
    return {name: p.detach().clone() for name, p in model.head.named_parameters()}


def assert_head_trained_and_reloads(model, before, out_dir, tokenizer):
    after = head_state(model)
    assert any(not torch.equal(before[name], after[name]) for name in before), "the head did not train"
    reloaded = AutoModelForCausalLM.from_pretrained(out_dir).eval()
    assert type(reloaded) is OutHeadsForCausalLM and reloaded.config.head_type == model.config.head_type
    ids = tokenizer(text(99), return_tensors="pt").input_ids
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, model.eval()(ids).logits)


@pytest.mark.parametrize("head", HEADS)
def test_fused_lm_head_is_the_head(head):
    """TRL's patch leaves the forward in place, and `fused_lm_head=True` gives the head's own
    loss and log-probabilities (eval mode: no dropout)."""
    model = build(head).eval()
    add_fused_lm_head(model, outputs=("log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1"))
    assert "forward" not in vars(model)
    data = batch("llama")
    data["labels"][:, :2] = -100
    with torch.no_grad():
        plain = model(**data)
        fused = model(**data, fused_lm_head=True)
    labels = data["labels"][:, 1:]
    mask = labels != -100
    log_p = plain.logits[:, :-1].float().log_softmax(-1)
    expected = log_p.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1) * mask
    torch.testing.assert_close(fused.log_probs, expected)
    torch.testing.assert_close(fused.loss, plain.loss)
    assert torch.equal(fused.label_mask, mask) and fused.is_top1.dtype == torch.bool
    torch.testing.assert_close(fused.entropy, -(log_p.exp() * log_p).sum(-1) * mask)
    shift_labels = torch.nn.functional.pad(labels, (0, 1), value=-100)  # already shifted, full length
    with torch.no_grad():
        shifted = model(input_ids=data["input_ids"], shift_labels=shift_labels, fused_lm_head=True)
        torch.testing.assert_close(shifted.log_probs[:, :-1], expected)
        torch.testing.assert_close(model(input_ids=data["input_ids"], shift_labels=shift_labels).loss, plain.loss)


def test_get_output_embeddings_is_the_head():
    model = build("tied")
    assert model.get_output_embeddings() is model.head
    with pytest.raises(TypeError, match="OutputHead"):
        model.set_output_embeddings(torch.nn.Linear(32, VOCAB))


@pytest.mark.parametrize("head", HEADS)
def test_sft_trainer_trains_saves_and_reloads(head, tokenizer, tmp_path):
    model = build(head)
    before = head_state(model)
    data = Dataset.from_dict({"text": [text(i) for i in range(8)]})
    args = trl.SFTConfig(output_dir=str(tmp_path), max_length=16, **TRAINING)
    trainer = trl.SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer)
    result = trainer.train()
    assert torch.isfinite(torch.tensor(result.training_loss))
    trainer.save_model(str(tmp_path / "final"))
    assert_head_trained_and_reloads(model, before, tmp_path / "final", tokenizer)


@pytest.mark.parametrize("head", HEADS)
def test_dpo_trainer_trains_saves_and_reloads(head, tokenizer, tmp_path):
    build(head).save_pretrained(tmp_path / "start")  # DPO loads its reference model from the policy's path
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "start")
    before = head_state(model)
    data = Dataset.from_dict({"prompt": [text(i, 4) for i in range(4)], "chosen": [text(10 + i, 3) for i in range(4)],
                              "rejected": [text(20 + i, 3) for i in range(4)]})
    args = trl.DPOConfig(output_dir=str(tmp_path), max_length=16, **TRAINING)
    trainer = trl.DPOTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer)
    assert isinstance(trainer.ref_model, OutHeadsForCausalLM)
    result = trainer.train()
    assert torch.isfinite(torch.tensor(result.training_loss))
    trainer.save_model(str(tmp_path / "final"))
    assert_head_trained_and_reloads(model, before, tmp_path / "final", tokenizer)


EMBEDDINGS = {"gpt2": "wte", "llama": "embed_tokens"}


@pytest.mark.parametrize("backbone", sorted(EMBEDDINGS))
@pytest.mark.parametrize("head", ["tied", "mos"])
def test_lora_on_input_embeddings_unmerged_equals_merged(head, backbone):
    """The head reads the embedding table the backbone uses: with a LoRA adapter on it (nonzero
    B), the unmerged model computes the merged model's logits."""
    model = build(head, backbone).eval()
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=[EMBEDDINGS[backbone]], init_lora_weights=False)
    wrapped = peft.get_peft_model(model, config).eval()
    data = batch(backbone)
    with torch.no_grad():
        with wrapped.disable_adapter():
            base_logits = wrapped(input_ids=data["input_ids"]).logits
        unmerged = wrapped(input_ids=data["input_ids"]).logits
        merged = wrapped.merge_and_unload()(input_ids=data["input_ids"]).logits
    assert (unmerged - base_logits).abs().max() > 1e-3  # the adapter changes the model
    torch.testing.assert_close(unmerged, merged, rtol=1e-5, atol=1e-5)


def test_lora_embedding_adapter_trains_through_the_head(tokenizer, tmp_path):
    """SFT with LoRA on the embeddings and attention: TRL accepts it (the output layer is not an
    adapter layer), and the embedding adapter gets gradients from the head too."""
    model = build("tied")
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["embed_tokens", "q_proj", "v_proj"])
    data = Dataset.from_dict({"text": [text(i) for i in range(8)]})
    args = trl.SFTConfig(output_dir=str(tmp_path), max_length=16, **TRAINING)
    trainer = trl.SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer, peft_config=config)
    lora_b = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_embedding_B" in n}
    assert lora_b
    trainer.train()
    changed = [n for n, p in trainer.model.named_parameters() if n in lora_b and not torch.equal(p, lora_b[n])]
    assert changed


def test_fused_lm_head_keeps_the_patch_temperature():
    """GRPO / RLOO patch with their sampling temperature: the log-probabilities are those of
    `softmax(logits / temperature)`, through the head."""
    model = build("mos").eval()
    add_fused_lm_head(model, temperature=2.0)
    data = batch("llama")
    with torch.no_grad():
        logits = model(data["input_ids"]).logits[:, :-1]
        fused = model(**data, fused_lm_head=True)
    expected = (logits.float() / 2.0).log_softmax(-1).gather(-1, data["labels"][:, 1:].unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(fused.log_probs, expected)


def test_trl_keeps_the_fused_lm_head_contract():
    """`model_io`'s documented contract with the installed TRL: `add_fused_lm_head(model,
    temperature=t)` assigns a bound forward taking `fused_lm_head` whose `temperature` is `t`.
    Checked on a plain transformers model (no hf_outheads interception): fails when TRL changes it."""
    from hf_outheads.model_io import fused_lm_head_settings, is_fused_lm_head_patch
    from tiny import tiny_original

    plain = tiny_original("llama")
    add_fused_lm_head(plain, temperature=2.5)
    assert is_fused_lm_head_patch(plain, plain.forward), "TRL's fused forward no longer takes `fused_lm_head`"
    assert fused_lm_head_settings(plain.forward) == {"temperature": 2.5}, "TRL no longer captures `temperature`"
