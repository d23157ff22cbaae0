"""Write a trained hf_outheads model (a run's output folder, or any `save_pretrained` folder) as
its backbone's own transformers class, with its tokenizer, for serving stacks that know only
the stock architectures (vLLM, TGI, llama.cpp converters, quantizers):

    python -m training.export_plain <trained_dir> <out_dir>
    python -m training.export_plain <trained_dir> <out_dir> --approximate --text-file sample.txt

Exact for `tied`, `linear`, `bilinear`, `drill` and `joint` with identity activation, where the
head has no output bias or the family holds one (BART, Marian); see the README's "Serving".
`--approximate` drops a bias the family cannot hold and prints the mean KL divergence from the
trained model on the lines of `--text-file`. Prints what was written, as JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from transformers import AutoConfig

import hf_outheads
from training.tokenization import load_saved_tokenizer


def load(trained_dir: str):
    """(model, tokenizer or None) from an hf_outheads folder, in eval mode."""
    config = AutoConfig.from_pretrained(trained_dir)
    if not isinstance(config, hf_outheads.OutHeadsConfig):
        raise SystemExit(f"{trained_dir} holds a '{config.model_type}' model, not an hf_outheads one: nothing to export.")
    model_class = hf_outheads.OutHeadsForSeq2SeqLM if config.is_encoder_decoder else hf_outheads.OutHeadsForCausalLM
    try:
        tokenizer = load_saved_tokenizer(trained_dir)  # None: no tokenizer saved with the model
    except ValueError as error:
        raise SystemExit(f"Not exported: {error}") from None
    return model_class.from_pretrained(trained_dir).eval(), tokenizer


def card_license(trained_dir: str) -> str | None:
    """The license in the trained model's card (README.md), carried over to the export's card."""
    from huggingface_hub import ModelCard

    card = Path(trained_dir) / "README.md"
    return ModelCard.load(card).data.license if card.is_file() else None


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trained_dir", help="folder of a trained hf_outheads model (save_pretrained)")
    parser.add_argument("out_dir", help="folder to write the plain transformers model to")
    parser.add_argument("--approximate", action="store_true",
                        help="drop an output bias the backbone's class cannot hold (needs --text-file)")
    parser.add_argument("--text-file", help="text, one sequence per line, on which to measure the mean KL divergence")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace out_dir when it is not empty (the whole folder, swapped in once written)")
    args = parser.parse_args(argv)
    model, tokenizer = load(args.trained_dir)
    texts = None
    if args.text_file:
        texts = [line for line in Path(args.text_file).read_text().splitlines() if line.strip()]
    try:
        result = model.export_plain(args.out_dir, tokenizer, approximate=args.approximate, texts=texts,
                                    overwrite=args.overwrite, license=card_license(args.trained_dir))
    except FileExistsError as error:
        raise SystemExit(f"Not exported: {error}") from None
    except ValueError as error:
        raise SystemExit(f"Not exported: {error} (Here: --approximate --text-file FILE.)") from None
    report = dataclasses.asdict(result)
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
