"""Every causal and encoder-decoder family of the installed transformers, converted by `from_backbone`
and compared with the original: the families whose conversion is proven exact, those it refuses
(and why), and those whose tiny model cannot be built here (and why).

    python -m studies.family_sweep     # sweep, write studies/results/families.json, then
    python -m maintainer.doc_tables       # rewrite the tables generated from it (docs/families.md, ...)

For each family of transformers' `MODEL_FOR_CAUSAL_LM_MAPPING_NAMES` and
`MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES`, the model class there is built from its config class
with tiny sizes (`SIZES`, set where the config declares the field; `FAMILY_SIZES` where a family ties
its sizes together), with every config number that looks like a logit transform (`LOGIT_FIELDS`) set
to one that changes the logits, and its output matrix scaled until its logits reach `LOGIT_SIZE`, so
that a transform the conversion missed shows. Then `from_backbone(original)` (the original head's own
form) must give the same logits (fp32, to 1e-5), loss, and cached greedy generation (`NEW_TOKENS` tokens, token
for token, and each step's logits), or refuse with a ValueError.
Outcomes (`Outcome.status`):
  - "exact": logits, loss and cached greedy generation equal (where the original can generate);
  - "refused": `from_backbone` raised a ValueError (its message is the reason);
  - "unbuildable": the tiny original could not be built or run here (its error is the reason);
  - "skipped": not tried: multimodal classes (a vision or audio sub-config; their text model is a family
    of its own) and composites of other families' models;
  - "differs": converted without a word, and something differs: a bug (`tests/test_families.py` fails).
`tests/test_families.py` runs the sweep and checks it against `studies/results/families.json`, so a new
transformers release shows what it broke.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import transformers
from transformers.models.auto import configuration_auto, modeling_auto

RESULTS = Path(__file__).resolve().parent / "results" / "families.json"
VOCAB, LOGIT_SIZE, MAX_PARAMETERS = 128, 30.0, 5_000_000
LAYERS = 2
# tiny sizes, each set where the family's config class declares the field (as a field or in its attribute_map)
SIZES = dict(
    vocab_size=VOCAB, hidden_size=32, d_model=32, num_hidden_layers=LAYERS, num_layers=LAYERS, num_decoder_layers=LAYERS,
    encoder_layers=LAYERS, decoder_layers=LAYERS, num_attention_heads=2, num_heads=2, encoder_attention_heads=2,
    decoder_attention_heads=2, num_key_value_heads=1, head_dim=16, d_kv=16, intermediate_size=64, d_ff=64,
    encoder_ffn_dim=64, decoder_ffn_dim=64, moe_intermediate_size=32, shared_expert_intermediate_size=32,
    num_experts=4, num_local_experts=4, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
    max_position_embeddings=64, unpadded_vocab_size=VOCAB, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    decoder_start_token_id=0,
)
# tried when a family does not build or run with `SIZES` alone: the sizes of rarer layers
MORE_SIZES = dict(
    embedding_dim=32, num_blocks=LAYERS, num_key_value_heads=2, d_head=16, ffn_hidden_size=64, rotary_dim=8,
    expert_ffn_hidden_size=32, n_group=1, topk_group=1, first_k_dense_replace=1, num_dense_layers=1,
    # multi-head latent attention and its indexer
    kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, index_topk=8,
    index_head_dim=16, index_n_heads=2,
    # state-space and linear-attention layers (one attention layer among the two: `attn_layer_*`)
    mamba_n_heads=4, mamba_d_head=16, mamba_d_state=8, mamba_chunk_size=16, mamba_dt_rank=8, n_mamba_heads=2,
    mamba_headdim=16, linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=2,
    attn_layer_period=2, attn_layer_offset=1, lru_width=32, attention_window_size=16,
    # per-layer inputs (Gemma 3n / 4)
    vocab_size_per_layer_input=VOCAB, hidden_size_per_layer_input=8, num_kv_shared_layers=0, laurel_rank=8,
)
# what a family needs besides `SIZES` (sizes its config checks against each other)
FAMILY_SIZES: dict[str, dict] = {
    "mamba2": {"expand": 1},
    "zaya": {"num_experts_per_tok": 1},
    "gpt_neo": {"attention_types": [[["global", "local"], 1]]},
    "zamba2": {"hybrid_layer_ids": [1]},
    "recurrent_gemma": {"block_types": ["recurrent", "attention"]},
    "granitemoehybrid": {"layer_types": ["mamba", "attention"]},
    "reformer": {"is_decoder": True, "axial_pos_shape": [8, 8], "axial_pos_embds_dim": [16, 16],
                 "attention_head_size": 16, "attn_layers": ["local", "local"], "local_attn_chunk_length": 8},
}
# config numbers that transform logits in some family (scale, soft cap): set to `LOGIT_VALUE` where they are numbers,
# and where None for the soft caps (whose None means "off"), so that a family transforming its logits shows it
LOGIT_FIELDS = re.compile(r"logit|soft_?cap|lm_head")
LOGIT_VALUE = 4.0
MULTIMODAL = re.compile(r"vision|audio|speech|image|video|encoder_config|codec|depth_decoder")
IDS = (3, VOCAB)  # token ids of the inputs: no special ids
NEW_TOKENS = 4  # greedy tokens generated (with the cache) and compared, each step's logits too


@dataclass
class Outcome:
    family: str
    model_class: str
    status: str  # "exact", "refused", "unbuildable", "differs"
    detail: str = ""


def families() -> list[tuple[str, str, bool]]:
    """(family, model class name, encoder-decoder) of every causal and seq2seq LM class transformers maps."""
    causal = [(family, name, False) for family, name in modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items()]
    seq2seq = [(family, name, True) for family, name in modeling_auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES.items()]
    return [row for row in causal + seq2seq if row[0] != "outheads"]


def declared(config_class) -> set[str]:
    return set(getattr(config_class, "__dataclass_fields__", {})) | set(getattr(config_class, "attribute_map", {}))


# what each try sets: `SIZES`, then also `MORE_SIZES`, then also the per-layer lists cut to `LAYERS` (`per_layer`)
ATTEMPTS = ((SIZES, False), ({**SIZES, **MORE_SIZES}, False), ({**SIZES, **MORE_SIZES}, True))


def tiny_config(family: str, attempt: int = 0):
    """The family's config with tiny sizes (`ATTEMPTS[attempt]`) and every logit transform switched on (`LOGIT_FIELDS`)."""
    return tiny(configuration_auto.CONFIG_MAPPING[family], FAMILY_SIZES.get(family, {}), *ATTEMPTS[attempt])


def tiny(config_class, extra: dict, sizes: dict = SIZES, layer_lists: bool = False):
    """`config_class` at tiny sizes (`sizes`, `per_layer` where `layer_lists`, its sub-configs likewise), logit
    transforms on, `extra` last."""
    names = declared(config_class)
    subs = getattr(config_class, "sub_configs", {}) or {}
    multimodal = sorted(name for name in subs if MULTIMODAL.search(name))
    if multimodal:
        raise Skipped(f"multimodal ({', '.join(multimodal)}): its text model is swept as its own family")
    if any(sub is configuration_auto.AutoConfig for sub in subs.values()):
        raise Skipped(f"composite ({', '.join(subs)}): built from models of other families, swept on their own")
    defaults = config_class()
    transforms = {name: LOGIT_VALUE for name in names if LOGIT_FIELDS.search(name) and not name.startswith("_")
                  and (isinstance(getattr(defaults, name, None), float) or getattr(defaults, name, 0) is None
                       and "cap" in name)}
    sub_configs = {name: tiny(sub, {}, sizes, layer_lists) for name, sub in subs.items()}
    layers = per_layer(defaults, config_class) if layer_lists else {}
    overrides = {**{k: v for k, v in sizes.items() if k in names}, **layers, **transforms, **sub_configs, **extra}
    return config_class(**overrides)


def per_layer(defaults, config_class) -> dict:
    """The fields holding one entry per layer (layer types, sparsity patterns), for `LAYERS` layers: kinds
    of layer (strings) each kept once where there are several, so that both kinds are built; others cut."""
    depth = next((getattr(defaults, n) for n in ("num_hidden_layers", "num_layers")
                  if isinstance(getattr(defaults, n, None), int)), None)
    fields = {}
    for name in sorted(getattr(config_class, "__dataclass_fields__", {})):
        try:
            value = getattr(defaults, name, None)
        except Exception:  # noqa: BLE001 (configs whose layers differ refuse some global reads)
            continue
        if depth and depth > LAYERS and isinstance(value, (list, tuple)) and len(value) == depth:
            kinds = list(dict.fromkeys(value)) if all(isinstance(v, str) for v in value) else list(value)
            fields[name] = (kinds * LAYERS)[:LAYERS]
    return fields


class Unbuildable(Exception):
    """The tiny original cannot be built or run here; the message says why."""


class Skipped(Exception):
    """Not a text model of its own (multimodal, composite); the message says why."""


def tiny_original(family: str, class_name: str, inputs: dict):
    """The family's model, tiny, in eval mode, its output matrix scaled so that its logits reach `LOGIT_SIZE`, and
    its outputs on `inputs`: from the first of `ATTEMPTS` that builds and runs (else Unbuildable, the last reason)."""
    for attempt in range(len(ATTEMPTS)):
        try:
            config = tiny_config(family, attempt)
            model_class = getattr(transformers, class_name)
            with torch.device("meta"):
                size = sum(p.numel() for p in model_class(config).parameters())
            if size > MAX_PARAMETERS:
                raise Unbuildable(f"{size:,} parameters at the tiny sizes (sizes the overrides do not reach)")
            torch.manual_seed(0)
            model = model_class(config).eval()
        except Skipped:
            raise
        except Unbuildable as error:
            reason = str(error)
            continue
        except Exception as error:  # noqa: BLE001 (any failure of a family's own code is its reason)
            reason = one_line(error)
            continue
        try:
            large_logits(model, inputs)
            with torch.no_grad():
                return model, model(**inputs)
        except Unbuildable as error:
            reason = str(error)
        except Exception as error:  # noqa: BLE001
            reason = f"the original fails: {one_line(error)}"
    raise Unbuildable(reason)


def one_line(error: BaseException, limit: int = 200) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text[:limit]}{'...' if len(text) > limit else ''}"


def inputs_for(seq2seq: bool) -> dict:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(*IDS, (2, 8), generator=g)
    if seq2seq:
        return {"input_ids": ids, "decoder_input_ids": torch.randint(*IDS, (2, 5), generator=g),
                "labels": torch.randint(*IDS, (2, 5), generator=g)}
    return {"input_ids": ids, "labels": ids}


@torch.no_grad()
def large_logits(model, inputs: dict) -> None:
    """Scale the output matrix until the largest logit is about `LOGIT_SIZE` (a tied one scales E too)."""
    head = model.get_output_embeddings()
    if head is None:
        raise Unbuildable("no output embeddings (get_output_embeddings() is None)")
    for _ in range(3):
        largest = model(**inputs).logits.float().abs().max().item()
        if not largest or largest > LOGIT_SIZE / 2:
            return
        head.weight.mul_(LOGIT_SIZE / largest)


@torch.no_grad()
def greedy(model, ids: torch.Tensor, seq2seq: bool):
    """Cached greedy generation of `NEW_TOKENS` tokens: its tokens and each step's logits."""
    extra = {"decoder_start_token_id": 0} if seq2seq else {}
    out = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0, use_cache=True,
                         return_dict_in_generate=True, output_logits=True, **extra)
    return out.sequences, torch.stack(out.logits, dim=1).float()


def check(family: str, class_name: str, seq2seq: bool) -> Outcome:
    """Convert the family's tiny model and compare (module docstring)."""
    from hf_outheads import OutHeadsForCausalLM, OutHeadsForSeq2SeqLM

    outcome = lambda status, detail="": Outcome(family, class_name, status, detail)
    inputs = inputs_for(seq2seq)
    try:
        original, want = tiny_original(family, class_name, inputs)
    except Unbuildable as error:
        return outcome("unbuildable", str(error))
    except Skipped as error:
        return outcome("skipped", str(error))
    try:
        converted = (OutHeadsForSeq2SeqLM if seq2seq else OutHeadsForCausalLM).from_backbone(original).eval()
    except ValueError as error:
        return outcome("refused", one_line(error, 400).removeprefix("ValueError: "))
    except Exception as error:  # noqa: BLE001 (a refusal must be a ValueError that says why)
        return outcome("differs", f"from_backbone fails: {one_line(error)}")
    try:
        with torch.no_grad():
            got = converted(**inputs)
        if not torch.allclose(got.logits.float(), want.logits.float(), rtol=1e-5, atol=1e-5):
            gap = (got.logits.float() - want.logits.float()).abs().max().item()
            return outcome("differs", f"logits differ by up to {gap:.3g}")
        if not torch.allclose(got.loss, want.loss, rtol=1e-5, atol=1e-5):
            return outcome("differs", f"loss {got.loss.item():.6g} against {want.loss.item():.6g}")
    except Exception as error:  # noqa: BLE001
        return outcome("differs", f"the converted model fails: {one_line(error)}")
    try:
        tokens, logits = greedy(original, inputs["input_ids"], seq2seq)
    except Exception as error:  # noqa: BLE001
        return outcome("exact", f"logits and loss (greedy not compared: the original's generate fails: "
                                f"{one_line(error)})")
    try:
        got_tokens, got_logits = greedy(converted, inputs["input_ids"], seq2seq)
    except Exception as error:  # noqa: BLE001
        return outcome("differs", f"generate fails: {one_line(error)}")
    if not torch.equal(got_tokens, tokens):
        return outcome("differs", "cached greedy tokens differ")
    differ = [step for step in range(logits.shape[1])
              if not torch.allclose(got_logits[:, step], logits[:, step], rtol=1e-5, atol=1e-5)]
    if differ:
        return outcome("differs", f"cached greedy generation's logits differ at new tokens {[s + 1 for s in differ]}")
    return outcome("exact")


def sweep(only: list[str] | None = None) -> list[Outcome]:
    """`check` for every family (or those named in `only`), quietly (the families' own warnings off)."""
    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    logging.getLogger("hf_outheads").setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return [check(*row) for row in families() if only is None or row[0] in only]
    finally:
        transformers.logging.set_verbosity(level)
        logging.getLogger("hf_outheads").setLevel(logging.NOTSET)


def record(outcomes: list[Outcome]) -> dict:
    return {"transformers": transformers.__version__, "outcomes": [asdict(o) for o in outcomes]}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", nargs="*", help="Sweep these families only (printed, not written).")
    args = parser.parse_args(argv)
    outcomes = sweep(args.families)
    for o in outcomes:
        print(f"{o.status:12} {o.family:28} {o.model_class:42} {o.detail}")
    if not args.families:
        RESULTS.write_text(json.dumps(record(outcomes), indent=1) + "\n")
        print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
