"""`hf-outheads export` and `hf-outheads serve` with the library and the `serve` extra alone
(`pip install ".[serve]"`), no training stack: a tiny GPT-2 `drill` model with its tokenizer is
exported (exactly), then served on 127.0.0.1 and asked for a greedy completion, which equals
`generate()`'s. Run from the repository root with PYTHONPATH=. (for `benchmarks.served`)."""
import importlib.util
import json
import subprocess
import tempfile
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

import hf_outheads
from benchmarks.served import BIN, ENV, server

present = [name for name in ("datasets", "accelerate", "evaluate", "sacrebleu") if importlib.util.find_spec(name)]
assert not present, f"the training stack is installed: {present}"
work = Path(tempfile.mkdtemp())
vocab = {f"w{i}": i for i in range(64)}
backend = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="w0", pad_token="w0", eos_token="w1")
torch.manual_seed(0)
backbone = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=64, n_head=2, vocab_size=64, bos_token_id=1, eos_token_id=1,
                                      initializer_range=0.5))
model = hf_outheads.OutHeadsForCausalLM.from_backbone(backbone, head_type="drill").eval()
model.save_pretrained(work / "drill")
tokenizer.save_pretrained(work / "drill")

export = subprocess.run([str(BIN / "hf-outheads"), "export", str(work / "drill"), str(work / "plain")], env=ENV,
                        capture_output=True, text=True, timeout=300)
assert export.returncode == 0, export.stderr[-3000:]
assert json.loads(export.stdout.strip().splitlines()[-1])["exact"] is True, export.stdout

prompt = "w5 w6 w7"
ids = tokenizer(prompt, return_tensors="pt").input_ids
expected = tokenizer.decode(model.generate(ids, max_new_tokens=6, do_sample=False, min_new_tokens=6)[0, ids.shape[1]:])
with server("hf-outheads", str(work / "drill"), log=work / "serve.log") as client:
    answer = client.completions.create(model=str(work / "drill"), prompt=prompt, max_tokens=6, temperature=0,
                                       extra_body={"min_tokens": 6})
    served = answer.choices[0].text
assert served.strip() == expected.strip(), (served, expected)
print("CI: with the library and the serve extra alone (no training stack), hf-outheads export wrote an exact plain "
      "model and hf-outheads serve answered generate()'s greedy tokens")
