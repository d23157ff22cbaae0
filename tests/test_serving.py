"""Serving with transformers' own OpenAI-compatible server, started for real on 127.0.0.1 and
queried with the `openai` client (the `serve` extra): `hf-outheads serve` for a model of every
causal head, and stock `transformers serve` for a plain export, in processes of their own that each
test starts on a free port and stops.

Greedy text served equals `generate()`'s in this process, for `/v1/completions` with and without
`--continuous-batching`, `/v1/chat/completions` (the tokenizer's chat template), streaming, and
`transformers chat` (transformers' terminal client). The
tokenizer is the package's own word-level one (`train_tokenizer`), whose decoding joins words with
spaces, so equal text is equal tokens."""

from __future__ import annotations

import subprocess

import openai
import pytest
import torch

from head_cases import HEAD_CASES
from benchmarks.served import BIN, ENV, free_port, server
from tiny import docstring_tokenizer, tiny_model

PROMPT = "the module"
NEW_TOKENS = 8
CHAT = [{"role": "user", "content": "what does the function return"}]
CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}assistant"


def greedy(model, tokenizer, ids) -> str:
    output = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False)
    return tokenizer.decode(output[0, len(ids):], skip_special_tokens=True)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny Llama-backed model of every head, saved with the tokenizer: {head: (folder, completion,
    chat reply)}, each reply `generate()`'s greedy text in this process."""
    root = tmp_path_factory.mktemp("serve")
    tokenizer = docstring_tokenizer(CHAT_TEMPLATE)
    prompt = tokenizer(PROMPT).input_ids
    chat = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True, return_dict=False)
    models = {}
    for head, options in HEAD_CASES.items():
        model = tiny_model("llama", head, options, seed=3)
        model.save_pretrained(root / head)
        tokenizer.save_pretrained(root / head)
        models[head] = (str(root / head), greedy(model, tokenizer, prompt), greedy(model, tokenizer, chat))
    return models


def completion(client, model: str, prompt: str = PROMPT, **kwargs) -> str:
    answer = client.completions.create(model=model, prompt=prompt, max_tokens=NEW_TOKENS, temperature=0, **kwargs)
    return answer.choices[0].text


def test_every_head_is_served_with_the_tokens_generate_gives(saved, tmp_path):
    """`hf-outheads serve` (no model preloaded: each request names a saved folder): completions, chat
    and streaming give `generate()`'s greedy text for every head. An unknown model and a prompt longer
    than a GPT-2 model's positions get the server's error answers, and the server goes on serving."""
    gpt2 = tmp_path / "gpt2"
    tiny_model("gpt2", "tied").save_pretrained(gpt2)
    docstring_tokenizer(CHAT_TEMPLATE).save_pretrained(gpt2)
    too_long = " ".join(["the module"] * 40)  # 80 tokens, 64 positions
    with server("hf-outheads", log=tmp_path / "server.log") as client:
        for head, (folder, want, chat_want) in saved.items():
            assert completion(client, folder) == want, (head, want)
            reply = client.chat.completions.create(model=folder, messages=CHAT, max_tokens=NEW_TOKENS, temperature=0)
            assert reply.choices[0].message.content == chat_want, (head, chat_want)
            stream = client.completions.create(model=folder, prompt=PROMPT, max_tokens=NEW_TOKENS, temperature=0,
                                               stream=True)
            assert "".join(chunk.choices[0].text for chunk in stream if chunk.choices) == want, head
        with pytest.raises(openai.InternalServerError):
            completion(client, str(tmp_path / "no-such-model"))
        with pytest.raises(openai.InternalServerError):
            completion(client, str(gpt2), prompt=too_long)
        with pytest.raises(openai.APIError, match="during streaming"):
            list(client.completions.create(model=str(gpt2), prompt=too_long, max_tokens=NEW_TOKENS, stream=True))
        assert completion(client, str(gpt2)) == greedy(tiny_model("gpt2", "tied"), docstring_tokenizer(CHAT_TEMPLATE),
                                                        docstring_tokenizer(CHAT_TEMPLATE)(PROMPT).input_ids)
        folder, want, _ = saved["mos"]
        assert completion(client, folder) == want


def test_transformers_chat_gets_the_models_reply_from_the_server(saved, tmp_path):
    """`transformers chat MODEL URL` (transformers' terminal client, its input piped) against `hf-outheads
    serve`: it prints `generate()`'s greedy reply through the chat template, and ends when told. It runs
    without HF_HUB_OFFLINE: huggingface_hub's offline mode refuses every request of that client, to
    127.0.0.1 too (docs/serving.md)."""
    folder, _, chat_want = saved["mos"]
    online = {key: value for key, value in ENV.items() if key != "HF_HUB_OFFLINE"}
    with server("hf-outheads", log=tmp_path / "server.log") as client:
        done = subprocess.run([str(BIN / "transformers"), "chat", folder, str(client.base_url),
                               f"max_new_tokens={NEW_TOKENS}", "do_sample=False"],
                              input=f"{CHAT[0]['content']}\nn\n!exit\n",  # the message; no more tokens; leave
                              capture_output=True, text=True, timeout=120, env={**online, "COLUMNS": "200"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert chat_want in [line.strip() for line in done.stdout.splitlines()], done.stdout[-2000:]

def test_every_head_is_served_with_continuous_batching(saved, tmp_path):
    """`hf-outheads serve --continuous-batching` (paged attention, transformers' batching manager) gives
    `generate()`'s greedy text for every head. The paged cache sized for these tiny models: by default it is sized
    from the machine's memory on a CPU, which took about 15 s for each model the server loaded (156 s for the test,
    26 s so)."""
    with server("hf-outheads", "--continuous-batching", "--cb-num-blocks", "32", "--cb-max-batch-tokens", "256",
                log=tmp_path / "server.log") as client:
        for head, (folder, want, _) in saved.items():
            assert completion(client, folder) == want, (head, want)


def test_a_model_named_on_the_command_line_is_preloaded_and_served_alone(saved, tmp_path):
    """`hf-outheads serve MODEL`: the server loads MODEL before it answers, serves it, and answers a
    request for another model with its error."""
    folder, want, _ = saved["drill"]
    with server("hf-outheads", folder, log=tmp_path / "server.log") as client:
        assert [model.id for model in client.models.list()] == [folder]
        assert completion(client, folder) == want
        with pytest.raises(openai.BadRequestError) as refused:
            completion(client, saved["tied"][0])
        assert "pinned" in str(refused.value.body), refused.value.body
        assert completion(client, folder) == want


def test_a_plain_export_is_served_by_stock_transformers_serve_without_the_package(saved, tmp_path):
    """A plain export (`export_plain`) is a stock model: `transformers serve` serves it in a process where
    `hf_outheads` cannot be imported, with the greedy text of the model it was exported from."""
    folder, want, _ = saved["linear"]
    from hf_outheads import OutHeadsForCausalLM

    OutHeadsForCausalLM.from_pretrained(folder).export_plain(tmp_path / "plain", docstring_tokenizer(CHAT_TEMPLATE))
    blocker = tmp_path / "no_package"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text("import sys\nsys.modules['hf_outheads'] = None  # not importable\n")
    env = {**ENV, "PYTHONPATH": str(blocker)}
    with server("transformers", str(tmp_path / "plain"), log=tmp_path / "server.log", env=env) as client:
        assert completion(client, str(tmp_path / "plain")) == want


def test_an_encoder_decoder_model_is_refused_in_one_line(tmp_path):
    """transformers' server decodes what follows the prompt in the output, which an encoder-decoder's
    output does not hold: `hf-outheads serve` refuses such a model before it starts."""
    tiny_model("t5", "tied").save_pretrained(tmp_path / "t5")
    run = subprocess.run([str(BIN / "hf-outheads"), "serve", str(tmp_path / "t5"), "--port", str(free_port())],
                         env=ENV, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr[-3000:]
    assert run.stderr.startswith("hf-outheads serve: error: ") and "encoder-decoder" in run.stderr, run.stderr


def test_a_folder_that_cannot_be_served_is_refused_in_one_line_naming_it(tmp_path):
    """A path that does not exist, a run still training (checkpoints, no saved model) and a model saved without
    its tokenizer: one line naming the folder and what is missing, status 2, before the server starts."""
    running = tmp_path / "running"
    (running / "checkpoints" / "checkpoint_2").mkdir(parents=True)
    (running / "metrics.jsonl").touch()
    bare = tmp_path / "bare"
    tiny_model("gpt2", "tied").save_pretrained(bare)
    for folder, said in ((tmp_path / "missing", "the folder {} does not exist."),
                         (running, "{} holds no saved model: no config.json (it holds the checkpoints of a run"),
                         (bare, "{} holds no tokenizer, which the server needs")):
        run = subprocess.run([str(BIN / "hf-outheads"), "serve", str(folder), "--port", str(free_port())],
                             env=ENV, capture_output=True, text=True, timeout=120)
        assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr[-3000:]
        assert run.stderr.startswith(f"hf-outheads serve: error: {said.format(folder)}"), run.stderr


def test_the_serving_benchmark_runs_and_prints_its_table(capsys):
    """`python -m benchmarks.bench_serving --tiny`: `generate()` and the served rates, with and without
    continuous batching, each with its ratio, in one table row per head."""
    from benchmarks.bench_serving import main

    main(["--tiny", "--heads", "tied", "--allow-busy", "--reps", "1"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| `tied`")]
    assert len(rows) == 1 and rows[0].count("x)") == 5, rows
