"""Served generation against `generate()` in one run: tokens/s of `hf-outheads serve` (transformers'
server on 127.0.0.1, queried with the `openai` client), with and without `--continuous-batching`,
and of vLLM's server through the package's vLLM plugin, for `tied` and `mos` at the quickstart
model's size (GPT-2, width 128, 2 layers, 512 positions, a BPE tokenizer of 2,000 words trained on
the standard library's docstrings; random weights), or at GPT-2 small's (`--size gpt2-small`).

For each head, in this order, on the same prompts (greedy, `--new-tokens` at most a prompt):
- `generate()` in this process, batch 1, one prompt after another (the reference);
- for each of `--servers` (`served`: `hf-outheads serve`; `served-cb`: with `--continuous-batching`;
  `vllm`: vLLM's server, float32 and eager on a CPU as vLLM's CPU build runs, bf16 with CUDA graphs
  on a GPU): one request after another, then `--concurrency` requests at once.
A rate is the tokens the answers hold (`usage.completion_tokens`; greedy text is the same in every
way, so every way makes the same tokens) over the wall time of all requests, the median of `--reps`
passes; each is printed beside its ratio to `generate()`'s. The script refuses to start when the
1-minute load average is above 0.5 (`--allow-busy` overrides it, and the table says so).

    python -m benchmarks.bench_serving --servers served,served-cb,vllm   # benchmarks/README.md (vLLM: docs/serving.md)
    python -m benchmarks.bench_serving --tiny --heads tied --allow-busy  # a smoke run (tests/test_serving.py)
    python -m benchmarks.bench_serving --device cuda --size gpt2-small --servers vllm --prompts 64 --concurrency 64
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import statistics
import time
from pathlib import Path

import torch

from benchmarks.bench_heads import check_load
from benchmarks.served import VLLM_SERVE, VLLM_SETTINGS, server


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--heads", default="tied,mos")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--vocab", type=int, default=2000)
    parser.add_argument("--tiny", action="store_true", help="width 32, 300 words, 2 prompts of 4 tokens: a smoke run")
    parser.add_argument("--allow-busy", action="store_true", help="run although the machine is busy")
    parser.add_argument("--servers", default="served,served-cb", help=f"comma-separated, of {', '.join(SERVERS)}")
    parser.add_argument("--size", choices=SIZES, default="quickstart", help="the GPT-2 backbone's shape")
    parser.add_argument("--device", default="cpu", help="generate()'s device (vLLM's is its platform's)")
    parser.add_argument("--out", default=None, help="also write the table to this file")
    parser.add_argument("--workdir", default=None, help="where the models are saved (default: a temporary folder)")
    return parser.parse_args(argv)


# GPT-2 shapes (width, layers, attention heads, positions): the quickstart's gpt2-tiny preset, GPT-2 small's, and the
# smoke run's; head dimension 32 or more (vLLM's CPU attention takes 32, 64, ...)
SIZES = {"quickstart": (128, 2, 4, 512), "gpt2-small": (768, 12, 12, 1024), "tiny": (32, 1, 1, 512)}
SERVERS = ("served", "served-cb", "vllm")


def server_command(name: str, folder: Path, device: str, positions: int) -> tuple:
    """The command line of server `name` for the model in `folder`."""
    if name == "vllm":
        engine = (("--dtype", "float32", "--enforce-eager") if device == "cpu"  # the GPU's memory shared with generate()'s
                  else ("--dtype", "bfloat16", "--gpu-memory-utilization", "0.5"))
        return (VLLM_SERVE, "--model", str(folder), *engine, "--max-model-len", str(positions), "--seed", "0")
    return ("hf-outheads", "--continuous-batching") if name == "served-cb" else ("hf-outheads",)


def build(head: str, tokenizer, size: str):
    from transformers import GPT2Config

    from hf_outheads import OutHeadsConfig, OutHeadsForCausalLM

    width, layers, heads, positions = SIZES[size]
    backbone = GPT2Config(n_embd=width, n_layer=layers, n_head=heads, n_positions=positions, vocab_size=len(tokenizer),
                          bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    return OutHeadsForCausalLM(OutHeadsConfig(text_config=backbone, head_type=head)).eval()


def rate(calls, reps: int) -> float:
    """Median over `reps` passes of tokens made / wall seconds; `calls()` returns the tokens made."""
    rates = []
    for _ in range(reps):
        start = time.perf_counter()
        tokens = calls()
        rates.append(tokens / (time.perf_counter() - start))
    return statistics.median(rates)


def served_rates(client, model: str, prompts: list[str], new_tokens: int, concurrency: int, reps: int):
    def one(prompt):
        answer = client.completions.create(model=model, prompt=prompt, max_tokens=new_tokens, temperature=0)
        return answer.usage.completion_tokens

    one(prompts[0])  # loads the model, warms the server up
    sequential = rate(lambda: sum(map(one, prompts)), reps)
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        together = rate(lambda: sum(pool.map(one, prompts)), reps)
    return sequential, together


def main(argv=None):
    args = parse_args(argv)
    load = check_load(args.allow_busy)
    import tempfile

    from hf_outheads.training.corpora.stdlib import iter_docstrings
    from hf_outheads.training.tokenization import train_tokenizer

    vocab = 300 if args.tiny else args.vocab
    new_tokens, count = (4, 2) if args.tiny else (args.new_tokens, args.prompts)
    size, servers = "tiny" if args.tiny else args.size, args.servers.split(",")
    if unknown := [name for name in servers if name not in SERVERS]:
        raise SystemExit(f"--servers: {', '.join(unknown)} unknown; choose among {', '.join(SERVERS)}")
    texts = [doc for _, _, doc in iter_docstrings()]
    tokenizer = train_tokenizer(texts, kind="bpe", vocab_size=vocab)
    prompts = [" ".join(doc.split()[:12]) for doc in texts[:count]]
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench_serving_"))
    rows = []
    for head in args.heads.split(","):
        model = build(head, tokenizer, size)
        folder = workdir / head
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        model.to(args.device)

        def generated():
            made = 0
            for prompt in prompts:
                ids = tokenizer(prompt, return_tensors="pt").input_ids.to(args.device)
                output = model.generate(ids, max_new_tokens=new_tokens, do_sample=False)
                made += output.shape[1] - ids.shape[1]
            return made

        generated()  # warm-up
        reference = rate(generated, args.reps)
        row = {"head": head, "generate": reference}
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}  # this process's threads
        for mode in servers:
            command, *extra = server_command(mode, folder, args.device, SIZES[size][3])
            with server(command, *extra, log=workdir / f"{head}-{mode}.log", env={**env, **VLLM_SETTINGS}) as client:
                row[mode], row[f"{mode} x{args.concurrency}"] = served_rates(
                    client, str(folder), prompts, new_tokens, args.concurrency, args.reps)
        rows.append(row)
    columns = [key for key in rows[0] if key != "head"]
    lines = [f"{count} prompts, {new_tokens} new tokens at most, median of {args.reps} passes; tokens/s (vs generate()); "
             f"GPT-2 {size}, {len(tokenizer)} words, {args.device}; 1-minute load average {load:.2f}"
             f"{' (busy: --allow-busy)' if load > 0.5 else ''}", "",
             "| head | " + " | ".join(columns) + " |", "| --- |" + " --- |" * len(columns)]
    for row in rows:
        cells = [f"{row[c]:.1f} ({row[c] / row['generate']:.2f}x)" for c in columns]
        lines.append(f"| `{row['head']}` | " + " | ".join(cells) + " |")
    print("\n".join(lines))
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
