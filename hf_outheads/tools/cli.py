"""`hf-outheads`, the installed command (pyproject.toml `[project.scripts]`):

    hf-outheads quickstart [--task lm|seq2seq|both] [--output_root outputs]   # the main job, offline
    hf-outheads train --config hf_outheads/training/configs/quickstart_lm.yaml [--key value ...]
    hf-outheads mtp-distill <run_dir> --output_dir <out_dir> [--prompts 512 --max_steps 300]
    hf-outheads export <trained_dir> <out_dir> [--approximate --text-file FILE] [--overwrite]
    hf-outheads gguf <llama_cpp_dir> <plain_dir> [convert_hf_to_gguf.py options]
    hf-outheads serve [MODEL] [transformers serve options]                    # transformers' own server

Each calls the `main(argv)` of its module, in this process, imported in its own branch: `quickstart`,
`train` and `mtp-distill` of `hf_outheads.training`, which need the training stack (`pip install
"hf_outheads[train]"`); `export`, `gguf` and `serve` of `hf_outheads.tools`, which need only what the
library needs (`serve` adds the server's packages, `[serve]`; `gguf` llama.cpp's converter's, `[gguf]`).
With no command, or an unknown one, it prints the usage on stderr and exits with status 2, as an
argparse command does when a required sub-command is missing, and as `transformers` and `hf` (the
Hugging Face CLIs) do (`accelerate` exits 1, `trl` 0); `hf-outheads --help` prints it on stdout with
status 0.
`train` is one process; several go through accelerate: `accelerate launch -m hf_outheads.training.train
...` (or, in a checkout, `accelerate launch hf_outheads/training/train.py ...`). `hf-outheads <command>
--help` lists a command's options.
"""

from __future__ import annotations

import importlib.util
import sys

COMMANDS = {  # command -> what it does
    "quickstart": "the offline quickstart: train, evaluate and publish two tiny models",
    "train": "train, evaluate and publish a model (one process)",
    "mtp-distill": "self-distil an mtp model's future-token predictors on its greedy output",
    "export": "write a trained model as its backbone's own transformers class",
    "gguf": "convert a plain export to GGUF with llama.cpp's convert_hf_to_gguf.py",
    "serve": "serve a model with transformers' OpenAI-compatible server (transformers serve)",
}
TRAINING_COMMANDS = ("quickstart", "train", "mtp-distill")
TRAIN_STACK = ("yaml", "accelerate", "datasets", "tokenizers", "evaluate", "sacrebleu")  # imported by every training command


def usage() -> str:
    rows = "\n".join(f"  {name:<12} {what}" for name, what in COMMANDS.items())
    return f"usage: hf-outheads <command> [options]\n\ncommands:\n{rows}\n\n`hf-outheads <command> --help` lists its options."


def usage_error(message: str) -> SystemExit:
    """A usage error: the usage and `message` on stderr, exit status 2 (argparse's)."""
    print(f"{usage()}\n\nhf-outheads: error: {message}", file=sys.stderr)
    return SystemExit(2)


def command_main(command: str):
    """The `main(argv)` of `command`'s module."""
    if command == "quickstart":
        from hf_outheads.training.quickstart import main
    elif command == "train":
        from hf_outheads.training.train import main
    elif command == "mtp-distill":
        from hf_outheads.training.mtp_distill import main
    elif command == "export":
        from hf_outheads.tools.export import main
    elif command == "gguf":
        from hf_outheads.tools.gguf_convert import main
    else:
        from hf_outheads.tools.serve import main
    return main


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(usage())
        return
    if not argv:
        raise usage_error("a command is required.")
    command = argv[0]
    if command not in COMMANDS:
        print(f"hf-outheads: error: unknown command {command!r}; choose one of {', '.join(COMMANDS)}.", file=sys.stderr)
        raise SystemExit(2)
    missing = [name for name in TRAIN_STACK if command in TRAINING_COMMANDS and importlib.util.find_spec(name) is None]
    if missing:
        raise SystemExit(f"hf-outheads {command}: error: the training stack is not installed ({', '.join(missing)}): "
                         "pip install 'hf_outheads[train]'.")
    sys.argv = [f"hf-outheads {command}", *argv[1:]]  # argparse's prog, in usage and errors
    command_main(command)(argv[1:])


if __name__ == "__main__":
    main()
