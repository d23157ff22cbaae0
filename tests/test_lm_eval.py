"""EleutherAI's lm-evaluation-harness scores a saved model of every head with the model's own
log-likelihood.

Each head's tiny Llama model (its head parameters moved off their start) is saved with its
tokenizer; one Python process that never imports hf_outheads, as a user's `lm_eval` does not,
evaluates every folder with `lm_eval.simple_evaluate(model="hf",
model_args="pretrained=FOLDER,trust_remote_code=True")`, what `lm_eval --model hf --model_args ...`
runs, on a local `loglikelihood_rolling` task: a task YAML in an include path, its documents a JSON
Lines file written here. Each document's log-likelihood is minus the model's summed next-token NLL
(its forward's `nll_loss` times the tokens scored) on the document's tokens after the prefix token
lm_eval puts first (the tokenizer's BOS, else its EOS), within 1e-4. The mixtures (`mos`, `doc`,
`lightrnn`) return log-probabilities as `logits`: lm_eval's log_softmax of them changes nothing,
which the equality shows."""

from __future__ import annotations

import json
import os
import sys

import torch

from head_cases import HEAD_CASES
from subprocess_runs import run
from tiny import VOCAB, perturb, tiny_model, word_tokenizer

TASK = """task: local_text
dataset_path: json
dataset_kwargs:
  data_files:
    test: {documents}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
"""

EVALUATE = r"""
import json, sys
import lm_eval
from lm_eval.tasks import TaskManager

tasks, out, folders = sys.argv[1], sys.argv[2], sys.argv[3:]
manager = TaskManager(include_path=tasks, include_defaults=False)  # the local task alone: no index of lm_eval's own
scores = {}
for folder in folders:
    result = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={folder},trust_remote_code=True",
                                     tasks=["local_text"], task_manager=manager, log_samples=True, device="cpu")
    samples = sorted(result["samples"]["local_text"], key=lambda sample: sample["doc_id"])
    scores[folder] = [sample["resps"][0][0] for sample in samples]
assert "hf_outheads" not in sys.modules, "lm_eval must run the saved model without hf_outheads"
with open(out, "w") as f:
    json.dump(scores, f)
"""


def test_lm_eval_scores_every_head_with_the_models_own_log_likelihood(tmp_path):
    tokenizer = word_tokenizer()
    g = torch.Generator().manual_seed(0)
    documents = [" ".join(f"w{i}" for i in torch.randint(3, VOCAB, (length,), generator=g).tolist())
                 for length in (5, 12, 20)]
    (tmp_path / "documents.jsonl").write_text("".join(json.dumps({"text": text}) + "\n" for text in documents))
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "local_text.yaml").write_text(TASK.format(documents=tmp_path / "documents.jsonl"))
    prefix = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    own = {}
    for head, options in HEAD_CASES.items():
        model = perturb(tiny_model("llama", head, options))
        folder = str(tmp_path / head)
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        own[folder] = []
        with torch.no_grad():
            for text in documents:
                ids = torch.tensor([[prefix, *tokenizer(text)["input_ids"]]])
                own[folder].append(-model(input_ids=ids, labels=ids).nll_loss.item() * (ids.shape[1] - 1))

    env = {**os.environ, "HF_DATASETS_CACHE": str(tmp_path / "datasets")}
    done = run([sys.executable, "-c", EVALUATE, str(tmp_path / "tasks"), str(tmp_path / "scores.json"), *own],
               env=env, timeout=400)
    assert done.returncode == 0, done.stderr[-4000:]
    scores = json.loads((tmp_path / "scores.json").read_text())
    for folder, want in own.items():
        torch.testing.assert_close(torch.tensor(scores[folder], dtype=torch.float64),
                                   torch.tensor(want, dtype=torch.float64), rtol=0, atol=1e-4,
                                   msg=lambda message: f"{os.path.basename(folder)}: {message}")
