"""The head comparison at GPT-2-small size, on one GPU, as a queue that outlives a GPU lease:
every head trains the same backbone on the same token budget and block order of the packed
corpus (`training/corpora/debian_docs.py`), compiled (`torch.compile`), in bf16 autocast with sdpa
attention, TF32 and fused AdamW, with no host sync per step; recorded per run: validation
perplexity (during and after training), perplexity by training-frequency band
(`hf_outheads.frequency_bands`), training tokens/s, training FLOPs (`hf_outheads.flops`), the
achieved FLOP rate against the device's bf16 peak measured at the start of the call, and the
loss path the head trained with.

    python -m studies.scale_heads --data data/scale_corpus --out OUTDIR --budget_s 300
    python -m studies.scale_heads --tabulate studies/results/scale_gpt2small/scale_runs.jsonl \\
        --out studies/results/scale_gpt2small        # the tables again, from the runs alone

The queue: the config's `queue` (run names in order) at the config's seed, then a second seed
for every run within `SECOND_SEED_WITHIN` of the best plain head (and for that head, so that
seeds pair). `--runs` (default: the committed `studies/results/scale_gpt2small/scale_runs.jsonl`)
holds the runs so far; the call copies them to `<out>/scale_runs.jsonl`, trains the next runs
that fit `--budget_s` (a run predicted, from the rates of the runs so far, to end past it is left
for the next call; one that still would, after its first `CHECK_STEP` steps, is given up), appends
each finished run at once, and writes the tables of every run so far into `<out>`. Copying
`<out>` over the committed folder records the call. `--heads` trains the names given instead.

A lean path beside `training/train.py`, for a short GPU lease: the corpus is already
tokenised and packed (no datasets, no tokenizer training there), the blocks sit on the
device, and the loop is a plain AdamW loop. Head names and variants are resolved as in
`studies/compare_heads.py` (a head type, or a key of the config's `head_options_by_head`
with `head_type`); the tables are its `write_results` (first line: the command), plus speed
and the comparison at equal wall time.
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

from hf_outheads.training.options import head_spec
from hf_outheads.training.throughput import peak_tflops

RUNS_FILE = "scale_runs.jsonl"
RESULTS = Path(__file__).parent / "results" / "scale_gpt2small"  # the committed runs: the queue's state
WARM_STEP, CHECK_STEP = 5, 15  # steps up to WARM_STEP compile (and may recompile): rates are timed after it;
# at CHECK_STEP a run's end is predicted again (--budget_s)
SECOND_SEED_WITHIN = 0.03  # a second seed for a run whose perplexity is within 3% of the best plain head's
FIRST_RUN_OVERHEAD_S = 120  # compilation and the first step, before any run on this device measured them


def build_model(cfg: dict, head: str, given, tokenizer, block_size: int):
    """The GPT-2-shaped model of `cfg` with head `head` and its given options (`HeadSpec.options`)."""
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


def predicted_seconds(flops: float, evaluations: int, eval_flops: float, runs: list[dict]) -> float | None:
    """Seconds a run of `flops` training FLOPs would take, from the slowest rate and the largest
    first-step time (compilation) of `runs` (the runs so far on this kind of device); None
    without such runs."""
    if not runs:
        return None
    rate = min(run["achieved_tflops"] for run in runs) * 1e12
    overhead = max(run.get("warm_up_s", run["first_step_s"]) for run in runs)
    return overhead + flops / rate + evaluations * eval_flops / 3 / rate  # an evaluation: forwards only


def train_head(name: str, cfg: dict, data: dict, device, deadline: float | None = None, seed: int | None = None,
               peak: float | None = None, earlier: list[dict] = ()):
    """Train and evaluate one run; None (with a line saying why) when it would end after
    `deadline` (a `time.perf_counter()` value): predicted from `earlier` runs before it starts,
    and again after `CHECK_STEP` steps."""
    from transformers import get_scheduler

    from hf_outheads.flops import training_flops_per_step

    spec = head_spec(name, cfg.get("head_options_by_head", {}))
    head, given, options = spec.head_type, spec.options, spec.spelt_out()
    seed = cfg["seed"] if seed is None else seed
    block, batch = data["train"].shape[1], cfg["batch_size"]
    steps = max(1, cfg["train_tokens"] // (batch * block))
    torch.manual_seed(seed)
    model = build_model(cfg, head, given, data["tokenizer"], block)
    per_step = training_flops_per_step(model, batch * block, block)
    validation = data["validation"][: cfg.get("eval_blocks")]  # None: every block
    predicted = predicted_seconds(per_step * steps, cfg["evaluations"], per_step / batch * len(validation), earlier)
    if deadline is not None and predicted is not None and time.perf_counter() + predicted > deadline:
        print(f"=== {name} (seed {seed}): left for the next call: predicted {predicted:.0f} s, "
              f"{deadline - time.perf_counter():.0f} s left of --budget_s", flush=True)
        return None
    bf16 = device.type == "cuda"
    model.to(device).train()
    model.head.set_word_counts(torch.as_tensor(data["word_counts"]))
    optimizer = optimizer_for(model, cfg, fused=device.type == "cuda")
    loss_path = model.head.loss_path(device)
    forward = model
    if cfg.get("torch_compile"):
        forward = torch.compile(model)  # the same parameters; evaluation runs the eager model
    scheduler = get_scheduler("cosine_with_min_lr", optimizer, num_warmup_steps=round(cfg["warmup_fraction"] * steps),
                              num_training_steps=steps, scheduler_specific_kwargs={"min_lr_rate": cfg["min_lr_ratio"]})
    periodic = model.head.updates_periodically
    if periodic:
        model.head.begin_periodic_updates()
    order = torch.from_numpy(block_order(len(data["train"]), steps, batch, cfg["seed"])).to(device)
    evals = {round(steps * (k + 1) / cfg["evaluations"]) for k in range(cfg["evaluations"])}
    curve, train_s, first_step_s, warm = [], 0.0, None, (1, 0.0)
    print(f"=== {name} (seed {seed}): {given if given is not None else head}, {steps} steps of {batch} x {block} tokens, "
          f"{per_step * steps:.3g} FLOPs, loss: {loss_path}"
          + (f", predicted {predicted:.0f} s" if predicted is not None else ""), flush=True)
    synchronize(device)
    start = time.perf_counter()
    for step in range(1, steps + 1):
        ids = data["train"][order[step - 1]]
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = forward(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if step in (1, min(WARM_STEP, steps), min(CHECK_STEP, steps)):
            synchronize(device)
            elapsed = train_s + time.perf_counter() - start  # training seconds so far
            first_step_s = elapsed if step == 1 else first_step_s
            warm = (step, elapsed) if step == min(WARM_STEP, steps) else warm
        if deadline is not None and step == min(CHECK_STEP, steps) > warm[0]:
            now = time.perf_counter()
            step_s = (elapsed - warm[1]) / (step - warm[0])
            evaluation_s = step_s * len(data["validation"][: cfg.get("eval_blocks")]) / batch / 2  # a forward, no backward
            end = now + step_s * (steps - step) * 1.03 + evaluation_s * len(evals) + 15  # + the tables
            if end > deadline:
                print(f"=== {name} (seed {seed}): given up after {step} steps: {step_s:.3f} s a step would end "
                      f"{end - deadline:.0f} s past --budget_s", flush=True)
                return None
        if step in evals:
            synchronize(device)
            train_s += time.perf_counter() - start
            if periodic:
                model.head.periodic_update()
            result = evaluate(model, validation, data["word_counts"], cfg["eval_batch_size"], bf16)
            model.train()
            curve.append({"step": step, "train_seconds": train_s, "train_flops": per_step * step,
                          "eval_perplexity": result["eval_perplexity"], "train_loss": float(loss.detach())})
            print(f"    step {step}/{steps}: loss {float(loss.detach()):.3f}, val. perplexity {result['eval_perplexity']:.2f}, "
                  f"{train_s:.0f} s", flush=True)
            synchronize(device)
            start = time.perf_counter()
    tokens = steps * batch * block
    steady = (train_s - warm[1]) / (steps - warm[0]) if steps > warm[0] else (train_s - first_step_s) / max(steps - 1, 1)
    return {
        "name": name, "head": head, "head_options": options, "seed": seed, **result,
        "parameters": sum(p.numel() for p in model.parameters()),
        "head_parameters": sum(p.numel() for p in model.head.parameters()),
        "train_steps": steps, "train_tokens": tokens, "train_seconds": train_s, "first_step_s": first_step_s,
        "warm_up_s": warm[1], "warm_up_steps": warm[0],
        "train_step_time_s": steady, "tokens_per_s": batch * block / steady,
        "train_flops_per_step": per_step, "train_flops": per_step * steps,
        "achieved_tflops": per_step / steady / 1e12, "peak_tflops": peak,
        "mfu": per_step / steady / (peak * 1e12) if peak else None,
        "attn_implementation": model.config.text_config._attn_implementation, "loss_path": loss_path,
        "torch_compile": bool(cfg.get("torch_compile")), "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "dtype": "bf16 autocast" if bf16 else "fp32", "model": {k: cfg[k] for k in ("n_layer", "n_embd", "n_head")},
        "curve": curve,
    }


def load_data(folder: Path, device) -> dict:
    from hf_outheads.training.corpora.debian_docs import load_blocks
    from hf_outheads.training.tokenization import load_tokenizer

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


def latest_runs(runs: list[dict]) -> list[dict]:
    """The latest run of each (name, seed)."""
    return list({(run["name"], run["seed"]): run for run in runs}.values())


def queue(cfg: dict, runs: list[dict], second_seeds: bool = True) -> list[tuple[str, int]]:
    """The (name, seed) runs still to train: the config's `queue` at its seed, then (`second_seeds`),
    once all of those are done, the second seed of every run within `SECOND_SEED_WITHIN` of the
    best plain head, and of that head."""
    done = {(run["name"], run["seed"]) for run in runs}
    first = [(name, cfg["seed"]) for name in cfg["queue"]]
    if not second_seeds or not all(item in done for item in first):
        return [item for item in first if item not in done]
    by_name = {run["name"]: run for run in runs if run["seed"] == cfg["seed"]}
    plain = [by_name[n] for n in ("tied", "linear") if n in by_name]
    if not plain:
        return []
    best = min(plain, key=lambda run: run["eval_perplexity"])
    close = [name for name, run in by_name.items()
             if run["eval_perplexity"] <= best["eval_perplexity"] * (1 + SECOND_SEED_WITHIN) and name != best["name"]]
    second = [(name, cfg["seed"] + 1) for name in ([best["name"]] + close) if name in cfg["queue"]] if close else []
    return [item for item in second if item not in done]


def speed_table(runs: list[dict]) -> str:
    lines = ["| run | seed | val. ppl | rare | medium | frequent | tokens/s | TFLOP/s | MFU (measured peak) | loss path | device |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for run in runs:
        bands = " | ".join(f"{run['eval_bands'][b]['perplexity'] or float('nan'):.1f}" for b in ("rare", "medium", "frequent"))
        mfu = f"{run['mfu']:.1%} of {run['peak_tflops']:.0f}" if run.get("mfu") else "-"
        lines.append(f"| {run['name']} | {run['seed']} | {run['eval_perplexity']:.2f} | {bands} | {run['tokens_per_s']:,.0f} | "
                     f"{run['achieved_tflops']:.1f} | {mfu} | {run.get('loss_path', '-')} | {run['device']} |")
    return "\n".join(lines)


def equal_time_table(runs: list[dict], best: str | None) -> str:
    """Each run's validation perplexity at the shortest training time of any run, against the best
    plain head's: a run's time at step k is k steady steps (`train_step_time_s`; compilation, which
    a later run of a call mostly finds cached, left out), its curve interpolated there
    (`comparison_tables.at_flops` on that time)."""
    from studies.comparison_tables import at_flops

    if best is None:
        return ""
    timed = [dict(run, curve=[dict(point, steady_seconds=point["step"] * run["train_step_time_s"])
                              for point in run["curve"]]) for run in runs]
    budget = min(run["train_steps"] * run["train_step_time_s"] for run in runs)
    at = {}
    for run in timed:
        value = at_flops(run, "eval_perplexity", budget, key="steady_seconds")
        if value is not None:
            at.setdefault(run["name"], []).append(value)
    if best not in at:
        return ""
    base = sum(at[best]) / len(at[best])
    lines = [f"Equal wall time: each run's curve interpolated at {budget:.0f} s of training at its steady step time, "
             "the shortest run's (a run whose first evaluation came later has no value).", "",
             "| run | val. perplexity at equal time | vs best plain at equal time |", "| --- | --- | --- |"]
    for name in dict.fromkeys(run["name"] for run in runs):
        if name in at:
            value = sum(at[name]) / len(at[name])
            lines.append(f"| {name} | {value:.2f} | {100 * (value / base - 1):+.1f}% |")
    return "\n".join(lines)


def tabulate(paths, out: Path, command: str) -> None:
    from studies.compare_heads import write_results

    runs = latest_runs(read_runs(paths))
    if not runs:
        raise SystemExit(f"No runs in {[str(p) for p in paths]}.")
    out.mkdir(parents=True, exist_ok=True)
    trained_by = " && ".join(dict.fromkeys(run["command"] for run in runs))
    rows = write_results(out, f"{trained_by} && {command}", sorted({run["seed"] for run in runs}), runs, plot=False)
    best = next((row["name"] for row in rows if row.get("eval_perplexity_vs_best_plain") == 0.0
                 and row.get("head") in ("tied", "linear")), None)
    text = (f"\nSpeed (training steps after the first {WARM_STEP}, which compile, evaluation excluded):\n\n" + speed_table(runs) + "\n\n"
            + equal_time_table(runs, best) + "\n")
    with (out / "results.md").open("a") as results:
        results.write(text)
    print(text)


def portable(arg: str) -> str:
    """A command-line argument as recorded in the results: an absolute path relative to the current
    folder when inside it, else `OUT` (no machine's paths in committed files)."""
    if not arg.startswith("/"):
        return arg
    try:
        return str(Path(arg).relative_to(Path.cwd()))
    except ValueError:
        return "OUT"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=Path(__file__).parent / "configs" / "scale_gpt2small.yaml")
    parser.add_argument("--data", type=Path, help="folder of the packed corpus (training/corpora/debian_docs.py)")
    parser.add_argument("--heads", help="comma-separated run names to train, in this order, at the config's seed "
                                        "(default: the queue, and its second seeds)")
    parser.add_argument("--runs", type=Path, default=RESULTS / RUNS_FILE,
                        help="the runs so far (default: the committed ones); copied into --out and extended there")
    parser.add_argument("--out", type=Path, required=True, help="folder of scale_runs.jsonl and the tables")
    parser.add_argument("--budget_s", type=float, help="leave runs predicted to end after this many seconds")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE", help="replace a config value")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tabulate", nargs="+", type=Path, metavar="RUNS_JSONL", help="only tabulate these runs")
    args = parser.parse_args(argv)
    command = "python -m studies.scale_heads " + shlex.join(map(portable, sys.argv[1:] if argv is None else argv))
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
    if args.heads:
        cfg["queue"] = [n.strip() for n in args.heads.split(",") if n.strip()]
    for name in cfg["queue"]:
        head_spec(name, cfg.get("head_options_by_head", {}))  # an unknown head or a wrong option fails before training
    started, device = time.perf_counter(), torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = True
    args.out.mkdir(parents=True, exist_ok=True)
    runs_file = args.out / RUNS_FILE
    runs = read_runs([args.runs]) if args.runs.resolve() != runs_file.resolve() else []
    if runs or not runs_file.exists():
        runs_file.write_text("".join(json.dumps(run) + "\n" for run in runs))
    runs = latest_runs(read_runs([runs_file]))
    second_seeds = not args.heads  # --heads: those runs only
    todo = queue(cfg, runs, second_seeds)
    if not todo:
        print(f"=== nothing left in the queue: every run is in {runs_file}", flush=True)
        return tabulate([runs_file], args.out, command)
    peak = peak_tflops(device.type)
    device_name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(f"=== {device_name}" + (f": dense bf16 peak measured {peak:.0f} TFLOP/s" if peak else "")
          + f"; queue: {', '.join(f'{n} (seed {s})' for n, s in todo)}", flush=True)
    data = load_data(args.data, device)
    deadline = None if args.budget_s is None else started + args.budget_s
    left = set()  # runs left for the next call
    while todo:
        name, seed = todo.pop(0)
        earlier = [run for run in runs if run["device"] == device_name]
        run = train_head(name, cfg, data, device, deadline, seed, peak, earlier)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if run is None:
            left.add((name, seed))
        else:
            run["command"] = command
            with runs_file.open("a") as out:
                out.write(json.dumps(run) + "\n")
            runs.append(run)
        if not todo:  # the second seeds, once every first run is done
            todo = [item for item in queue(cfg, runs, second_seeds) if item not in left]
    tabulate([runs_file], args.out, command)


if __name__ == "__main__":
    main()
