"""Convert a transformers LM, generate, save, reload through AutoModelForCausalLM.

Runs offline on a tiny random GPT-2. With a real model, the first step is simply
    model = OutHeadsForCausalLM.from_backbone("gpt2")                      # Hub id (or a local folder)
    model = OutHeadsForCausalLM.from_backbone("gpt2", head_type="bilinear")  # another head
and the tokenizer is the original's: `AutoTokenizer.from_pretrained("gpt2")`.
"""

import tempfile

import torch
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

from hf_outheads import OutHeadsForCausalLM  # importing it registers it with the Auto classes


def main():
    torch.manual_seed(0)
    config = GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=99, n_positions=64, bos_token_id=1, eos_token_id=2)
    original = GPT2LMHeadModel(config).eval()  # stands in for a pretrained GPT-2

    # 1. Convert: the backbone's weights are kept, the tied head E h + b copies GPT-2's LM head.
    model = OutHeadsForCausalLM.from_backbone(original, head_type="tied").eval()
    print(f"converted {type(original).__name__} -> {type(model).__name__} with head '{model.config.head_type}'")

    # 2. Generate: the converted model emits exactly the original's tokens.
    prompt = torch.tensor([[5, 17, 42, 8]])
    tokens = model.generate(prompt, max_new_tokens=10, do_sample=False, pad_token_id=0)
    assert torch.equal(tokens, original.generate(prompt, max_new_tokens=10, do_sample=False, pad_token_id=0))
    print(f"generated {tokens[0, prompt.shape[1]:].tolist()} (same as the original GPT-2)")

    # 3. Save (safetensors + config + the code files), reload through the Auto class.
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        reloaded = AutoModelForCausalLM.from_pretrained(folder).eval()
        # without hf_outheads installed: AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
    again = reloaded.generate(prompt, max_new_tokens=10, do_sample=False, pad_token_id=0)
    assert torch.equal(again, tokens)
    print(f"saved and reloaded as {type(reloaded).__name__}: generated tokens identical")


if __name__ == "__main__":
    main()
