"""Writes `tests/saved_heads/`: tiny models with a scaled map (bilinear, joint, the mixtures'
latents) saved by the code of commit 4b7ea0f (before the maps shared one implementation), each
as its config.json and weights, plus the logits that code computed (`expected.safetensors`).
`tests/test_saved_heads.py` loads them with today's code and checks the logits are identical.
Run from the repository root with that commit checked out: `python -m tests.saved_heads.make_fixture`.
Kept for the record of how the fixture was made; it is not run by the suite."""

import json
import pathlib

import torch
from safetensors.torch import save_file
from transformers import GPT2Config

from hf_outheads import OutHeadsConfig, OutHeadsForCausalLM

HERE = pathlib.Path(__file__).parent
VOCAB = 24
CASES = {  # name: (head_type, head_options)
    "bilinear": ("bilinear", {}),  # map_scale None -> 0.1
    "bilinear_uniform": ("bilinear", {"init": "uniform", "map_scale": 0.5}),
    "joint": ("joint", {"joint_dim": 6}),  # map_scale None -> 0.01
    "joint_sigmoid_output": ("joint", {"form": "output", "activation": "sigmoid", "map_scale": 0.3}),
    "joint_uniform_context": ("joint", {"form": "context", "init": "uniform", "map_scale": 0.2}),
    "mos": ("mos", {"num_components": 2, "latent_dim": 6}),  # map_scale None -> 0.01
    "mos_plain": ("mos", {"num_components": 2, "map_scale": 1.0}),
    "mos_uniform_tanh": ("mos", {"num_components": 2, "latent_init": "uniform", "latent_activation": "tanh",
                                 "map_scale": 0.25}),
    "doc": ("doc", {"components": [[-1, 2], [1, 1]], "latent_dim": 10, "map_scale": 0.5}),
    "lightrnn": ("lightrnn", {"num_components": 2, "num_exclusive": 4, "num_rows": 4, "num_columns": 5,
                              "latent_init": "identity", "map_scale": 0.1}),
}


def backbone() -> GPT2Config:
    return GPT2Config(n_embd=8, n_layer=2, n_head=2, vocab_size=VOCAB, n_positions=8, bos_token_id=1,
                      eos_token_id=2, pad_token_id=0)


def main() -> None:
    ids = torch.randint(3, VOCAB, (2, 5), generator=torch.Generator().manual_seed(0))
    expected = {"input_ids": ids}
    for i, (name, (head_type, options)) in enumerate(CASES.items()):
        torch.manual_seed(i)
        model = OutHeadsForCausalLM(OutHeadsConfig(text_config=backbone(), head_type=head_type,
                                                   head_options=options)).eval()
        with torch.no_grad():  # every stored value away from its init, so that each term of a map counts
            for param in model.head.parameters():
                param.add_(torch.randn_like(param) * 0.3)
        folder = HERE / name
        folder.mkdir(exist_ok=True)
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, folder / "model.safetensors")
        (folder / "config.json").write_text(json.dumps(model.config.to_dict(), indent=1, sort_keys=True) + "\n")
        with torch.no_grad():
            expected[name] = model(input_ids=ids).logits.contiguous()
    save_file(expected, HERE / "expected.safetensors")


if __name__ == "__main__":
    main()
