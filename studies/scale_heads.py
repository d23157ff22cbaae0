"""The head comparison at GPT-2-small size, on one GPU: every head trains the same backbone
on the same token budget and block order of the packed corpus (`studies/scale_corpus.py`),
in bf16 autocast with sdpa attention; recorded per head: validation perplexity (during and
after training), perplexity by training-frequency band (`hf_outheads.frequency_bands`),
training tokens/s, training FLOPs (`hf_outheads.flops`) and the achieved FLOP rate.

    python -m studies.scale_heads --config studies/configs/scale_gpt2small.yaml \\
        --data data/scale_corpus --heads linear,tied,sigsoftmax,mos-k1,mos --out OUTDIR [--budget_s 520]
    python -m studies.scale_heads --tabulate OUT2/scale_runs.jsonl OUT3/scale_runs.jsonl \\
        --out studies/results/scale_gpt2small           # one table from several calls' runs

A lean path beside `training/train.py`, for a short GPU lease: the corpus is already
tokenised and packed (no datasets, no tokenizer training there), the blocks sit on the
device, and the loop is a plain AdamW loop. Head names and variants are resolved as in
`studies/compare_heads.py` (a head type, or a key of the config's `head_options_by_head`
with `head_type`); the tables are its `write_results` (first line: the command).

Each finished head is appended to `<out>/scale_runs.jsonl` at once, and a head already
there is not trained again, so a killed or time-limited call resumes in the next. With
`--budget_s`, a head is given up, saying so, when after its first `CHECK_STEP` steps its
measured step time predicts an end past the budget (a head is never cut short: every head
trains on the same tokens).
`--override KEY=VALUE` replaces a config value (YAML syntax), e.g. for the `--tiny` check.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import torch
import yaml

from training.options import head_spec

RUNS_FILE = "scale_runs.jsonl"
CHECK_STEP = 10  # the step after which a head's end is predicted (--budget_s)
H200_BF16_FLOPS = 790e12  # bf16 matrix-product rate measured on this workplace's H200 (the MFU's base)


def build_model(cfg: dict, head: str, given: dict, tokenizer, block_size: int):
    from transformers import GPT2Config

    from hf_outheads import OutHeadsConfig, OutHeadsForCausalLM

    drop = cfg["dropout"]
    text = GPT2Config(n_layer=cfg["n_layer"], n_embd=cfg["n_embd"], n_head=cfg["n_head"], n_positions=block_size,
                      vocab_size=len(tokenizer), resid_pdrop=drop, embd_pdrop=drop, attn_pdrop=drop,
                      bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                      pad_token_id=tokenizer.pad_token_id, attn_implementation="sdpa")
    return OutHeadsForCausalLM(OutHeadsConfig(text_config=text, head_type=head, head_options=given))


def optimizer_for(model, cfg: dict, fused: bool):
    """AdamW, no weight decay on 1-d parameters (biases, norms), as training/train.py."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": cfg["weight_decay"]},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg["learning_rate"], betas=tuple(cfg["adam_betas"]), fused=fused)


def block_order(blocks: int, steps: int, batch: int, seed: int) -> np.ndarray:
    """Indices of the `steps x batch` training blocks: epochs of fresh permutations (one seed,
    the same for every head), as many as the budget needs."""
    rng = np.random.default_rng(seed)
    epochs = math.ceil(steps * batch / blocks)
    return np.concatenate([rng.permutation(blocks) for _ in range(epochs)])[: steps * batch].reshape(steps, batch)


def evaluate(model, validation: torch.Tensor, word_counts, batch: int, bf16: bool) -> dict:
    """Validation perplexity and its frequency bands (every block, the model's own shift)."""
    from hf_outheads.frequency_bands import frequency_band_perplexity

    batches = ({"input_ids": ids, "labels": ids} for ids in validation.split(batch))
    with torch.autocast(validation.device.type, dtype=torch.bfloat16, enabled=bf16):
        bands = frequency_band_perplexity(model, batches, word_counts)
    tokens = sum(b["tokens"] for b in bands.values())
    nll = sum(b["tokens"] * math.log(b["perplexity"]) for b in bands.values() if b["tokens"])
    return {"eval_perplexity": math.exp(nll / tokens), "eval_tokens": tokens, "eval_bands": bands}


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def train_head(name: str, cfg: dict, data: dict, device, deadline: float | None = None):
    """Train and evaluate one run; None (with a line saying why) when it would end after
    `deadline` (a `time.perf_counter()` value)."""
    from transformers import get_scheduler

    from hf_outheads.flops import training_flops_per_step

    spec = head_spec(name, cfg.get("head_options_by_head", {}))
    head, given, options = spec.head_type, spec.options, spec.spelt_out()
    block, batch = data["train"].shape[1], cfg["batch_size"]
    steps = max(1, cfg["train_tokens"] // (batch * block))
    torch.manual_seed(cfg["seed"])
    model = build_model(cfg, head, given, data["tokenizer"], block)
    per_step = training_flops_per_step(model, batch * block, block)
    bf16 = device.type == "cuda"
    model.to(device).train()
    model.head.set_word_counts(torch.as_tensor(data["word_counts"]))
    optimizer = optimizer_for(model, cfg, fused=device.type == "cuda")
    scheduler = get_scheduler("cosine_with_min_lr", optimizer, num_warmup_steps=round(cfg["warmup_fraction"] * steps),
                              num_training_steps=steps, scheduler_specific_kwargs={"min_lr_rate": cfg["min_lr_ratio"]})
    periodic = model.head.updates_periodically
    if periodic:
        model.head.begin_periodic_updates()
    order = torch.from_numpy(block_order(len(data["train"]), steps, batch, cfg["seed"])).to(device)
    evals = {round(steps * (k + 1) / cfg["evaluations"]) for k in range(cfg["evaluations"])}
    curve, train_s, first_step_s = [], 0.0, None
    print(f"=== {name}: {head} {given}, {steps} steps of {batch} x {block} tokens, "
          f"{per_step * steps:.3g} FLOPs", flush=True)
    synchronize(device)
    start = time.perf_counter()
    for step in range(1, steps + 1):
        ids = data["train"][order[step - 1]]
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if step == 1:
            synchronize(device)
            first_step_s = time.perf_counter() - start
        if deadline is not None and step == min(CHECK_STEP, steps):
            synchronize(device)
            now = time.perf_counter()
            step_s = (now - start - first_step_s) / max(step - 1, 1)
            evaluation_s = step_s * len(data["validation"][: cfg.get("eval_blocks")]) / batch / 2  # a forward, no backward
            end = now + step_s * (steps - step) * 1.03 + evaluation_s * len(evals) + 15  # + the tables
            if end > deadline:
                print(f"=== {name}: given up after {step} steps: {step_s:.3f} s a step would end {end - deadline:.0f} s "
                      "past --budget_s", flush=True)
                return None
        if step in evals:
            synchronize(device)
            train_s += time.perf_counter() - start
            if periodic:
                model.head.periodic_update()
            validation = data["validation"][: cfg.get("eval_blocks")]  # None: every block
            result = evaluate(model, validation, data["word_counts"], cfg["eval_batch_size"], bf16)
            model.train()
            curve.append({"step": step, "train_seconds": train_s, "train_flops": per_step * step,
                          "eval_perplexity": result["eval_perplexity"], "train_loss": float(loss.detach())})
            print(f"    step {step}/{steps}: loss {float(loss.detach()):.3f}, val. perplexity {result['eval_perplexity']:.2f}, "
                  f"{train_s:.0f} s", flush=True)
            synchronize(device)
            start = time.perf_counter()
    tokens = steps * batch * block
    steady = (train_s - first_step_s) / max(steps - 1, 1)
    return {
        "name": name, "head": head, "head_options": options, "seed": cfg["seed"], **result,
        "parameters": sum(p.numel() for p in model.parameters()),
        "head_parameters": sum(p.numel() for p in model.head.parameters()),
        "train_steps": steps, "train_tokens": tokens, "train_seconds": train_s, "first_step_s": first_step_s,
        "train_step_time_s": steady, "tokens_per_s": batch * block / steady,
        "train_flops_per_step": per_step, "train_flops": per_step * steps,
        "achieved_tflops": per_step / steady / 1e12,
        "mfu_vs_h200_bf16": per_step / steady / H200_BF16_FLOPS if device.type == "cuda" else None,
        "attn_implementation": model.config.text_config._attn_implementation,
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "dtype": "bf16 autocast" if bf16 else "fp32", "model": {k: cfg[k] for k in ("n_layer", "n_embd", "n_head")},
        "curve": curve,
    }


def load_data(folder: Path, device) -> dict:
    from studies.scale_corpus import load_blocks
    from training.tokenization import load_tokenizer

    tokenizer = load_tokenizer(str(folder), auto=False)
    train, validation = load_blocks(folder, "train"), load_blocks(folder, "validation")
    return {"tokenizer": tokenizer, "word_counts": np.bincount(train.ravel(), minlength=len(tokenizer)),
            "train": torch.from_numpy(train.astype(np.int64)).to(device),
            "validation": torch.from_numpy(validation.astype(np.int64)).to(device)}


def read_runs(paths) -> list[dict]:
    runs = []
    for path in map(Path, paths):
        if path.exists():
            runs += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return runs


def tabulate(paths, out: Path, command: str) -> None:
    from studies.compare_heads import write_results

    runs = list({run["name"]: run for run in read_runs(paths)}.values())  # the latest run of each name
    if not runs:
        raise SystemExit(f"No runs in {[str(p) for p in paths]}.")
    out.mkdir(parents=True, exist_ok=True)
    trained_by = " && ".join(dict.fromkeys(run["command"] for run in runs))
    write_results(out, f"{trained_by} && {command}", sorted({run["seed"] for run in runs}), runs, plot=False)
    lines = ["| head | val. ppl | rare | medium | frequent | tokens/s | TFLOP/s | MFU | train FLOPs |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for run in runs:
        bands = " | ".join(f"{run['eval_bands'][b]['perplexity'] or float('nan'):.1f}" for b in ("rare", "medium", "frequent"))
        mfu = f"{run['mfu_vs_h200_bf16']:.0%}" if run.get("mfu_vs_h200_bf16") else "-"
        lines.append(f"| {run['name']} | {run['eval_perplexity']:.2f} | {bands} | {run['tokens_per_s']:,.0f} | "
                     f"{run['achieved_tflops']:.1f} | {mfu} | {run['train_flops']:.3g} |")
    with (out / "results.md").open("a") as results:
        results.write("\nSpeed (training steps after the first, evaluation excluded):\n\n" + "\n".join(lines) + "\n")
    print("\n".join(lines))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=Path(__file__).parent / "configs" / "scale_gpt2small.yaml")
    parser.add_argument("--data", type=Path, help="folder of the packed corpus (studies/scale_corpus.py)")
    parser.add_argument("--heads", default="linear,tied,sigsoftmax,mos-k1,mos,lightrnn,doc,drill-own",
                        help="comma-separated run names, trained in this order")
    parser.add_argument("--out", type=Path, required=True, help="folder of scale_runs.jsonl and the tables")
    parser.add_argument("--budget_s", type=float, help="skip a head predicted to end after this many seconds")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE", help="replace a config value")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tabulate", nargs="+", type=Path, metavar="RUNS_JSONL", help="only tabulate these runs")
    args = parser.parse_args(argv)
    command = "python -m studies.scale_heads " + shlex.join(sys.argv[1:] if argv is None else argv)
    if args.tabulate:
        return tabulate(args.tabulate, args.out, command)
    if args.data is None:
        parser.error("--data is needed to train")
    cfg = yaml.safe_load(args.config.read_text())
    for item in args.override:
        key, sep, value = item.partition("=")
        if not sep or key not in cfg:
            parser.error(f"--override {item!r}: use KEY=VALUE with a key of {args.config} ({sorted(cfg)})")
        cfg[key] = yaml.safe_load(value)
    names = [n.strip() for n in args.heads.split(",") if n.strip()]
    for name in names:
        head_spec(name, cfg.get("head_options_by_head", {}))  # an unknown head or a wrong option fails before training
    started, device = time.perf_counter(), torch.device(args.device)
    data = load_data(args.data, device)
    args.out.mkdir(parents=True, exist_ok=True)
    runs_file = args.out / RUNS_FILE
    done = {run["name"] for run in read_runs([runs_file])}
    for name in names:
        if name in done:
            print(f"=== {name}: already in {runs_file}", flush=True)
            continue
        run = train_head(name, cfg, data, device, None if args.budget_s is None else started + args.budget_s)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if run is None:
            continue
        run["command"] = command
        with runs_file.open("a") as runs:
            runs.write(json.dumps(run) + "\n")
    tabulate([runs_file], args.out, command)


if __name__ == "__main__":
    main()
