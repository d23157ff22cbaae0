"""`hf-outheads export` with the library alone (`pip install .`), and `hf-outheads serve` once the
`serve` extra is installed too: no training stack in either (datasets, evaluate, sacrebleu; nor
accelerate, but for transformers' own server, whose `serving` extra requires it). A tiny GPT-2 `drill`
model with its tokenizer is exported (exactly) and, with the server's packages, served on 127.0.0.1
and asked for a greedy completion, which equals `generate()`'s. Run from the repository root with
PYTHONPATH=. (for `benchmarks.served`)."""
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

import hf_outheads

serving = importlib.util.find_spec("fastapi") is not None  # the serve extra
training_stack = ("datasets", "evaluate", "sacrebleu") + (() if serving else ("accelerate",))
present = [name for name in training_stack if importlib.util.find_spec(name)]
assert not present, f"the training stack is installed: {present}"
work = Path(tempfile.mkdtemp())
vocab = {f"w{i}": i for i in range(64)}
backend = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="w0", pad_token="w0", eos_token="w1")
torch.manual_seed(1)  # (a model whose greedy text does not end at once)
backbone = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=64, n_head=2, vocab_size=64, bos_token_id=1, eos_token_id=1,
                                      initializer_range=0.5))
model = hf_outheads.OutHeadsForCausalLM.from_backbone(backbone, head_type="drill").eval()
model.save_pretrained(work / "drill")
tokenizer.save_pretrained(work / "drill")
command = Path(sys.executable).parent / "hf-outheads"  # this environment's

export = subprocess.run([str(command), "export", str(work / "drill"), str(work / "plain")], capture_output=True,
                        text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
assert export.returncode == 0, export.stderr[-3000:]
assert json.loads(export.stdout.strip().splitlines()[-1])["exact"] is True, export.stdout
print("CI: hf-outheads export wrote an exact plain model without the training stack")
if serving:
    from benchmarks.served import server

    prompt = "w5 w6 w7"
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    greedy = tokenizer.decode(model.generate(ids, max_new_tokens=6, do_sample=False)[0, ids.shape[1]:],
                              skip_special_tokens=True)
    with server("hf-outheads", str(work / "drill"), log=work / "serve.log") as client:
        answer = client.completions.create(model=str(work / "drill"), prompt=prompt, max_tokens=6, temperature=0)
    assert answer.choices[0].text.strip() == greedy.strip() != "", (answer.choices[0].text, greedy)
    print("CI: hf-outheads serve answered generate()'s greedy tokens with the serve extra, without the training stack")
