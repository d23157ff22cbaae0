"""`hf-outheads serve [MODEL] [options]`: transformers' own OpenAI-compatible server (`transformers
serve`, the server `transformers chat` talks to) for the causal models of this package, every head.

It runs `transformers serve` itself, in this process, with its options as typed: this module only
makes the package's causal class resolvable by that server (`make_classes_resolvable`) and refuses,
in one line, what the server would answer wrongly (an encoder-decoder model named on the command
line). No server of this package's own: `/v1/completions`, `/v1/chat/completions` (the tokenizer's
chat template), streaming and `--continuous-batching` are transformers'. A plain export
(`hf-outheads export`) is a stock transformers model: stock `transformers serve` serves it.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from hf_outheads.tools.command_line import looks_local, quiet_deepspeed_cpu_notice
from hf_outheads.tools.saved_tokenizer import TOKENIZER_FILES

PROGRAM = "hf-outheads serve"
SERVING_STACK = ("fastapi", "uvicorn", "openai")  # transformers' `is_serve_available` and the `serve` extra
USAGE = f"""usage: {PROGRAM} [MODEL] [transformers serve options]

transformers' OpenAI-compatible server (`transformers serve`) for the causal models this package
trains, converts and saves, every head; every option of `transformers serve` is passed to it as
typed (`transformers serve --help` lists them). MODEL (a saved folder or a Hub id) is preloaded and
used for every request; without it a request's `model` names the folder or Hub id to load. An
encoder-decoder (seq2seq) model is refused: the server decodes only what follows the prompt in a
decoder-only output. A plain export (`hf-outheads export`) is served by `transformers serve` itself.

examples:
    {PROGRAM} outputs/quickstart_lm --port 8000
    {PROGRAM} outputs/quickstart_lm --continuous-batching --host 127.0.0.1
    transformers chat outputs/quickstart_lm http://localhost:8000/v1  # a chat in the terminal, through the server

Install the server's packages with: pip install 'hf_outheads[serve]'
"""


def make_classes_resolvable() -> None:
    """Put this package's causal class in the `transformers` namespace, where transformers' server
    looks a checkpoint's class up by name
    (`transformers.cli.serving.model_manager.ModelManager._load_model`:
    `architecture = getattr(transformers, config.architectures[0])`).
    A class of custom code is not there (TRL's same lookup falls back to the config's `auto_map`);
    delete this function, and `hf-outheads serve` with it, once that line resolves `auto_map` too,
    so that `transformers serve MODEL --trust-remote-code` serves these models."""
    import transformers

    from hf_outheads import OutHeadsForCausalLM

    if not hasattr(transformers, OutHeadsForCausalLM.__name__):
        setattr(transformers, OutHeadsForCausalLM.__name__, OutHeadsForCausalLM)


def forced_model(command, args: list[str]) -> str | None:
    """The MODEL argument of `transformers serve` as its own parser reads `args`, or None (none
    given, or a usage error, which the server's parser then reports itself)."""
    import click

    try:
        context = command.make_context(PROGRAM, list(args), resilient_parsing=True)
    except click.ClickException:
        return None
    return context.params.get("force_model")


def refusal(model: str | None) -> str | None:
    """Why `model` (a folder, or a Hub id or None: not read here) cannot be served, or None: a folder that
    does not exist, holds no saved model (a run still training has only its checkpoints) or no tokenizer,
    or an encoder-decoder model."""
    if model is None:
        return None
    folder = Path(model)
    if not folder.exists():
        return f"the folder {model} does not exist." if looks_local(model) else None  # a Hub id: the server's
    if not (folder / "config.json").is_file():
        training = " (it holds the checkpoints of a run that has not finished: serve the folder when the run has " \
                   "ended and saved its model)" if (folder / "checkpoints").is_dir() else ""
        return f"{model} holds no saved model: no config.json{training}."
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        return f"{model}/config.json cannot be read ({type(error).__name__}: {error})."
    if config.get("is_encoder_decoder"):  # every seq2seq config says so (PretrainedConfig's own field)
        return (f"{model} is an encoder-decoder model ({', '.join(config.get('architectures') or ['seq2seq'])}): "
                "transformers serve decodes only what follows the prompt in a decoder-only output, so it would answer "
                "wrongly; generate with it in Python (model.generate).")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        return (f"{model} holds no tokenizer, which the server needs to read prompts and write answers: save the "
                "tokenizer the model was trained with there (tokenizer.save_pretrained).")
    return None


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else list(argv)
    if any(arg in ("-h", "--help") for arg in args):
        print(USAGE)
        return
    missing = [name for name in SERVING_STACK if importlib.util.find_spec(name) is None]
    if missing:
        raise SystemExit(f"{PROGRAM}: error: the server's packages are not installed ({', '.join(missing)}): "
                         "pip install 'hf_outheads[serve]'.")
    import click
    import typer
    from transformers.cli.transformers import app  # a click group, or a typer app with older huggingface_hub

    serve = (app if isinstance(app, click.Group) else typer.main.get_command(app)).commands["serve"]
    reason = refusal(forced_model(serve, args))
    if reason is not None:
        print(f"{PROGRAM}: error: {reason}", file=sys.stderr)
        raise SystemExit(2)
    quiet_deepspeed_cpu_notice()
    make_classes_resolvable()
    serve.main(args=args, prog_name=PROGRAM)


if __name__ == "__main__":
    main()
