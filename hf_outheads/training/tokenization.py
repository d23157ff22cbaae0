"""Tokenizers: a pretrained model's, or one trained on the training split with `tokenizers`.

- `bpe`: byte-level BPE with a chosen code-dictionary size (vocab_size). A smaller
  dictionary makes every softmax (and a mixture's K softmaxes) cheaper: the Efficient-MoS
  way (Kong et al. 2019). Byte-level: every string round-trips exactly.
- `wordlevel`: whitespace-separated words, the `vocab_size - 4` most frequent kept,
  the rest `<unk>` (PTB-style; PTB already marks rare words).
Both are wrapped as `PreTrainedTokenizerFast` with <pad>, <s>, </s>, <unk>, saved with the model.
A saved or pretrained one is loaded by `hf_outheads.tools.saved_tokenizer`.
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from hf_outheads.tools.saved_tokenizer import load_tokenizer

SPECIAL_TOKENS = {"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
TRAINABLE = ("bpe", "wordlevel")


def _untrained(kind: str, lowercase: bool) -> Tokenizer:
    unk = SPECIAL_TOKENS["unk_token"]
    if kind == "bpe":
        tokenizer = Tokenizer(models.BPE(unk_token=None))
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
    elif kind == "wordlevel":
        tokenizer = Tokenizer(models.WordLevel(unk_token=unk))
        tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        tokenizer.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    else:
        raise ValueError(f"Unknown tokenizer kind {kind!r}: use one of {TRAINABLE}.")
    if lowercase:
        tokenizer.normalizer = normalizers.Lowercase()
    return tokenizer


def _trainer(kind: str, vocab_size: int, min_frequency: int):
    special = list(SPECIAL_TOKENS.values())
    if kind == "bpe":
        alphabet = pre_tokenizers.ByteLevel.alphabet()
        return trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=special,
                                   initial_alphabet=alphabet, show_progress=False)
    return trainers.WordLevelTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=special,
                                     show_progress=False)


def train_tokenizer(texts, kind: str = "bpe", vocab_size: int = 8000, min_frequency: int = 2,
                    lowercase: bool = False) -> PreTrainedTokenizerFast:
    """Train on an iterable of strings (or of lists of strings) and wrap for transformers."""
    tokenizer = _untrained(kind, lowercase)
    tokenizer.train_from_iterator(texts, trainer=_trainer(kind, vocab_size, min_frequency))
    if kind == "bpe" and tokenizer.get_vocab_size() < vocab_size:
        raise ValueError(
            f"The training text only supports {tokenizer.get_vocab_size()} BPE codes, fewer than the requested "
            f"tokenizer_vocab_size={vocab_size}: lower it or lower tokenizer_min_frequency."
        )
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, **SPECIAL_TOKENS)


def load_pretrained_tokenizer(name_or_path: str) -> PreTrainedTokenizerFast:
    """A Hub id or local folder; a tokenizer without a pad token gets eos as padding."""
    try:
        tokenizer = load_tokenizer(name_or_path)
    except (OSError, ValueError) as error:  # no such folder or Hub id, no network, ...: said in one line
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ValueError(f"The tokenizer {name_or_path!r} cannot be loaded: {reason}") from error
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def context_length(options, positions: int | None) -> int:
    """The saved tokenizer's `model_max_length`: the model's positions (n_positions /
    max_position_embeddings), or, for a backbone without a limit (T5's relative positions),
    the lengths it was trained on."""
    if positions:
        return positions
    data = options.data
    return data.block_size if options.model.task == "causal_lm" else max(data.max_source_length, data.max_target_length)
