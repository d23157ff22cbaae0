"""Write a trained hf_outheads model (a run's output folder, or any `save_pretrained` folder) as
its backbone's own transformers class, with its tokenizer, for serving stacks that know only
the stock architectures (vLLM, TGI, llama.cpp converters, quantizers):

    hf-outheads export <trained_dir> <out_dir>
    hf-outheads export <trained_dir> <out_dir> --approximate --text-file sample.txt

`trained_dir` is a folder, or a Hub repo id (`namespace/name`) when no folder of that name exists
and it does not look like a local path (`looks_local`). Exact for `tied`, `linear`, `bilinear`, `drill` and `joint` with identity activation, where the
head has no output bias or the family holds one (BART, Marian); see the README's "Serving".
`--approximate` drops what the family's class cannot hold (an output bias, a soft cap) and prints
the mean KL divergence from the trained model on the lines of `--text-file`. Prints what was
written, as JSON.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import hf_outheads  # its names are imported when first used: `--help` answers without torch
from hf_outheads.tools.command_line import CommandParser, looks_local, quiet_deepspeed_cpu_notice, refuse
from hf_outheads.tools.folders import TargetIsSource, writable_target
from hf_outheads.tools.saved_tokenizer import load_saved_tokenizer

def load_config(trained_dir: str):
    """The model's config from a folder, or from the Hub for a repo id; anything else is one line."""
    from transformers import AutoConfig  # (after the parse: it imports torch)

    import hf_outheads.configuration_outheads  # noqa: F401  (registers the outheads config: its folders load)

    if not Path(trained_dir).exists() and looks_local(trained_dir):
        raise refuse(f"Not exported: the folder {trained_dir} does not exist.")
    try:
        return AutoConfig.from_pretrained(trained_dir)
    except (OSError, ValueError) as error:  # no model config there, or a repo id the Hub lacks (or cannot be reached)
        reason = str(error).strip().splitlines()[0]
        if Path(trained_dir).exists():
            raise refuse(f"Not exported: {trained_dir} holds no model ({reason}).") from None
        raise refuse(f"Not exported: {trained_dir} is no folder here, and loading it from the Hub failed "
                         f"({reason}).") from None


def load(trained_dir: str):
    """(model, tokenizer or None) from an hf_outheads folder, in eval mode."""

    config = load_config(trained_dir)
    if not isinstance(config, hf_outheads.OutHeadsConfig):
        raise refuse(f"Not exported: {trained_dir} holds a '{config.model_type}' model, not an hf_outheads one: "
                     "nothing to export.")
    model_class = hf_outheads.OutHeadsForSeq2SeqLM if config.is_encoder_decoder else hf_outheads.OutHeadsForCausalLM
    try:
        tokenizer = load_saved_tokenizer(trained_dir)  # None: no tokenizer saved with the model
    except ValueError as error:
        raise refuse(f"Not exported: {error}") from None
    try:
        return model_class.from_pretrained(trained_dir).eval(), tokenizer
    except (OSError, ValueError) as error:  # weights missing, damaged or of another head
        raise refuse(f"Not exported: the model in {trained_dir} does not load: {str(error).strip().splitlines()[0]}") \
            from None


def card_license(trained_dir: str) -> str | None:
    """The license in the trained model's card (README.md), carried over to the export's card."""
    from huggingface_hub import ModelCard

    card = Path(trained_dir) / "README.md"
    return ModelCard.load(card).data.license if card.is_file() else None


def main(argv=None) -> dict:
    parser = CommandParser(description=__doc__)
    parser.add_argument("trained_dir", help="folder of a trained hf_outheads model (save_pretrained)")
    parser.add_argument("out_dir", help="folder to write the plain transformers model to")
    parser.add_argument("--approximate", action="store_true",
                        help="drop an output bias or a soft cap the backbone's class cannot hold (needs --text-file)")
    parser.add_argument("--text-file", help="text, one sequence per line, on which to measure the mean KL divergence "
                                            "(needed by --approximate)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace out_dir when it is not empty (the whole folder, swapped in once written)")
    args = parser.parse_args(argv)
    if args.approximate and not args.text_file:
        parser.error("--approximate measures what it drops costs on --text-file FILE: give it.")
    if args.text_file and not Path(args.text_file).is_file():
        parser.error(f"--text-file {args.text_file}: no such file.")
    texts = None
    if args.text_file:
        texts = [line for line in Path(args.text_file).read_text(errors="replace").splitlines() if line.strip()]
        if not texts:
            parser.error(f"--text-file {args.text_file} holds no text: give a few lines of the text the model will "
                         "serve.")
    try:  # before the model is loaded; export_plain checks again (the same rule) as it writes
        writable_target(args.out_dir, overwrite=args.overwrite, sources=[args.trained_dir],
                        overwrite_hint="pass --overwrite")
    except (FileExistsError, TargetIsSource) as error:
        raise refuse(f"Not exported: {error}") from None
    quiet_deepspeed_cpu_notice()
    model, tokenizer = load(args.trained_dir)
    if texts and tokenizer is None:
        raise refuse(f"Not exported: --text-file is read with the model's tokenizer, and {args.trained_dir} holds "
                     "none: save the tokenizer the model was trained with there (tokenizer.save_pretrained) and export "
                     "again.")
    from hf_outheads.tools.export_plain import NotExact

    try:
        result = model.export_plain(args.out_dir, tokenizer, approximate=args.approximate, texts=texts,
                                    overwrite=args.overwrite, license=card_license(args.trained_dir))
    except (FileExistsError, TargetIsSource) as error:
        raise refuse(f"Not exported: {error}") from None
    except NotExact as error:  # what --approximate drops
        raise refuse(f"Not exported: {error} (Here: --approximate --text-file FILE.)") from None
    except ValueError as error:  # no plain form (the head says why)
        raise refuse(f"Not exported: {error}") from None
    report = dataclasses.asdict(result)
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
