"""Tiny random backbones shared by the tests (hidden 32, 2 layers, vocab 99), and `tiny_model`,
the one builder of hf_outheads models on them."""

from __future__ import annotations

import itertools

import torch
from transformers import (
    BartConfig,
    BartForConditionalGeneration,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MarianConfig,
    MarianMTModel,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    T5Config,
    T5ForConditionalGeneration,
)

VOCAB = 99
IDS = dict(bos_token_id=1, eos_token_id=2, pad_token_id=0)
_decoder = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64, **IDS)
_bartlike = dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
                 encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=VOCAB, max_position_embeddings=64,
                 decoder_start_token_id=2, forced_eos_token_id=None, **IDS)

CAUSAL = {
    "gpt2": (GPT2LMHeadModel, lambda: GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=VOCAB, n_positions=64, **IDS)),
    "llama": (LlamaForCausalLM, lambda: LlamaConfig(tie_word_embeddings=False, **_decoder)),
    "qwen2": (Qwen2ForCausalLM, lambda: Qwen2Config(tie_word_embeddings=False, **_decoder)),
    "mistral": (MistralForCausalLM, lambda: MistralConfig(tie_word_embeddings=False, **_decoder)),
}
SEQ2SEQ = {
    "t5": (T5ForConditionalGeneration, lambda: T5Config(d_model=32, d_ff=64, d_kv=8, num_layers=2, num_heads=4,
                                                         vocab_size=VOCAB, decoder_start_token_id=0, pad_token_id=0,
                                                         eos_token_id=1)),
    "bart": (BartForConditionalGeneration, lambda: BartConfig(**_bartlike)),
    "marian": (MarianMTModel, lambda: MarianConfig(**_bartlike)),
}
ALL = {**CAUSAL, **SEQ2SEQ}


def tiny_config(name: str):
    return ALL[name][1]()


def tiny_original(name: str, seed: int = 0):
    """A random transformers LM of family `name`, in eval mode. BART/Marian get a nonzero
    `final_logits_bias` so that conversion must carry it."""
    torch.manual_seed(seed)
    model_class, make_config = ALL[name]
    model = model_class(make_config()).eval()
    if hasattr(model, "final_logits_bias"):
        model.final_logits_bias.normal_(0, 0.5)
    return model


def batch(name: str, batch_size: int = 2, length: int = 7, seed: int = 1) -> dict:
    """Token ids (no special ids) for a causal LM, or input ids + labels for seq2seq."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (batch_size, length), generator=g)
    if name in SEQ2SEQ:
        return {"input_ids": ids, "labels": torch.randint(3, VOCAB, (batch_size, length - 2), generator=g)}
    return {"input_ids": ids, "labels": ids.clone()}


def model_class(name: str):
    from hf_outheads import OutHeadsForCausalLM, OutHeadsForSeq2SeqLM

    return OutHeadsForSeq2SeqLM if name in SEQ2SEQ else OutHeadsForCausalLM


def tiny_model(name: str, head_type: str, options=None, seed: int = 0):
    """The one test builder: an hf_outheads model on the tiny `name` backbone with a fresh
    `head_type` head (seeded), in eval mode; `options` a dict or the head's options object."""
    from hf_outheads import OutHeadsConfig

    torch.manual_seed(seed)
    config = OutHeadsConfig(text_config=tiny_config(name), head_type=head_type, head_options=options)
    return model_class(name)(config).eval()


@torch.no_grad()
def perturb(model, seed: int = 0, scale: float = 0.1):
    """Move every head parameter away from its start (the maps start at the identity, biases at
    0), so that a dropped context map, offset or bias changes the logits."""
    g = torch.Generator().manual_seed(seed)
    for parameter in model.head.parameters():
        parameter.add_(torch.randn(parameter.shape, generator=g) * scale)
    return model


def word_tokenizer(size: int = VOCAB):
    """A `PreTrainedTokenizerFast` of `size` words (the tiny vocabulary's): word `wN` is token N, split on whitespace."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(size)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="w0", pad_token="w0", eos_token="w2")


def docstring_tokenizer(chat_template: str | None = None):
    """A word-level tokenizer of real words (the package's, trained on standard-library docstrings) of the tiny
    models' size, with `chat_template`: for tests that send text, where `word_tokenizer`'s `wN` words would not do."""
    from hf_outheads.training.corpora.stdlib import iter_docstrings
    from hf_outheads.training.tokenization import train_tokenizer

    texts = [doc for _, _, doc in itertools.islice(iter_docstrings(), 50)]
    tokenizer = train_tokenizer(texts, kind="wordlevel", vocab_size=VOCAB, min_frequency=1, lowercase=True)
    assert len(tokenizer) == VOCAB
    tokenizer.chat_template = chat_template
    return tokenizer
