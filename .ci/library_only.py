"""The library without the training stack (`pip install .`, no extras): it imports, converts a
model, generates and renders the model card from its installed template, and none of the `train`
extra's packages is installed."""
import importlib.util

import torch
from transformers import GPT2Config, GPT2LMHeadModel

import hf_outheads

missing = [name for name in ("datasets", "accelerate", "evaluate", "sacrebleu") if importlib.util.find_spec(name)]
assert not missing, f"installed without being asked for: {missing}"
torch.manual_seed(0)
original = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50, bos_token_id=0, eos_token_id=0))
model = hf_outheads.OutHeadsForCausalLM.from_backbone(original, head_type="drill").eval()
ids = torch.tensor([[1, 2, 3]])
assert torch.equal(model.generate(ids, max_new_tokens=5, do_sample=False),
                   original.eval().generate(ids, max_new_tokens=5, do_sample=False))
card = model.create_model_card("someone/gpt2-drill")  # the template installed with the package (hf_outheads/tools/model_card.md)
assert "`drill` output head" in card.text and "arxiv:1905.05513" in card.data.tags, card.text
print("CI: the library alone (no extras) imports, converts, generates and renders its card")
