"""Training-step time, step memory and generation speed of every head, as ratios to `tied`.

Each (head, |V|, N) case runs in a fresh subprocess (so peak memory is that case's own),
on one small Llama-style backbone (d = d_h = 256, 2 layers, sequences of 512 tokens);
figures are medians over `--reps` repetitions, measured side by side in one run.

    python -m benchmarks.bench_heads                      # |V| = 32K, N = 1K, every head
    python -m benchmarks.bench_heads --vocab 32000,50257,128000 --positions 1024,4096

Columns: `step` = one AdamW training step (forward with labels, backward, update);
`step vs tied` = the same against a `tied` model's step timed in the same worker, the two
alternating (as `gen vs tied` below); `vs floor` = step over its floor
`backbone + K x (tied - backbone)`, the backbone's step plus K times tied's head (K = the
mixture's component count, 1 for single-softmax heads);
`step mem` = peak RSS during the step above the RSS before it (large allocations are
forced to mmap so freed memory leaves RSS); `peak` = the process's absolute peak RSS;
`gen tok/s` = greedy generation with KV cache, batch 1 (median of `--gen-reps` calls of
`--gen-tokens` new tokens after a 16-token prompt); `gen vs tied` = the same against the
`tied` model, alternating calls with it. Ratios are never taken across workers: between
them the machine's slower and faster spells moved a step or a 64-token call by 10-20%.

`--device cuda` (bf16 autocast unless `--dtype fp32`): times from CUDA events, `step mem` =
`torch.cuda.max_memory_allocated` during the step above what was allocated before it, `peak`
= the allocator's absolute peak; every case of one |V| and N in one worker process (the
allocator's statistics are reset per case); `vs floor` counts K times `tied-own`'s head when that
case ran (the fused loss on the package's own kernels, which the mixtures use: the floor built
from the same kernel), else `tied`'s; then the plain head's fused loss against torch's
`F.linear_cross_entropy`, Liger-Kernel and cut-cross-entropy (`bench_gpu.py`) at each |V| and N:

    python -m benchmarks.bench_heads --device cuda --vocab 32000,128000 --positions 8192,16384

`--backbone gpt2-small` measures on GPT-2-small's shape instead (12 layers, d = 768, 1,024-token
sequences), where the backbone is most of a step, as in a user's training.

Timings mean nothing on a busy machine: the script refuses to start when the 1-minute load
average is above 0.5, unless `--allow-busy` is given (then the table says so).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from benchmarks.bench_gpu import cpu_clock
from benchmarks.reference_mos import COMPARED, use_reference_mos
from hf_outheads.training.options import head_spec


def head_variants() -> dict[str, dict]:
    """Every case, as a config's `head_options_by_head` writes it (a variant names its `head_type`;
    `hf_outheads.training.options.head_spec` is the one rule from a case's name to its head): `tied` and
    `backbone` (the ratios' bases; `backbone` is the backbone alone, the loss on its hidden states:
    the part of a step no head changes), every registered head's `benchmark_options` (a variant
    named `head_type-variant`), and the published MoS code's computation (`reference_mos.COMPARED`)."""
    from hf_outheads import HEAD_CLASSES

    cases = {"tied": {}, "backbone": {"head_type": "tied"}}
    for head_type, cls in HEAD_CLASSES.items():
        for variant, options in cls.benchmark_options.items():
            cases.setdefault(f"{head_type}-{variant}" if variant else head_type,
                             {"head_type": head_type, **options} if variant else dict(options))
    for reference, compared in COMPARED.items():
        cases[reference] = {"head_type": head_spec(compared, cases).head_type, **cases[compared]}
    return cases


HEAD_VARIANTS = head_variants()
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the workers run as `python -m benchmarks.bench_heads`
# name -> (transformers config class, its fields, sequence length); the vocabulary comes from --vocab
BACKBONES = {
    "llama-2x256": ("LlamaConfig", dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=4, max_position_embeddings=4096, tie_word_embeddings=False),
                    512),
    "gpt2-small": ("GPT2Config", dict(n_embd=768, n_layer=12, n_head=12, n_positions=1024, attn_implementation="sdpa"),
                   1024),
    "gpt2-tiny": ("GPT2Config", dict(n_embd=64, n_layer=2, n_head=2, n_positions=256, attn_implementation="sdpa"), 256),
}
MAX_LOAD = 0.5  # 1-minute load average above which timings are not trusted


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--heads", default=",".join(HEAD_VARIANTS),
                        help="comma-separated heads (tied and backbone, the ratios' bases, are always run)")
    parser.add_argument("--vocab", default="32000", help="comma-separated vocabulary sizes")
    parser.add_argument("--positions", default="1024", help="comma-separated N = batch x sequence positions")
    parser.add_argument("--reps", type=int, default=3, help="timed repetitions per case (median reported)")
    parser.add_argument("--gen-tokens", type=int, default=64, help="tokens generated per generation repetition")
    parser.add_argument("--gen-reps", type=int, default=9,
                        help="timed generations per case (median reported); a 64-token call takes a few tenths "
                             "of a second, so one disturbance moves a median of 3")
    parser.add_argument("--no-generate", action="store_true", help="skip the generation measurement")
    parser.add_argument("--threads", type=int, default=2, help="torch threads in each worker")
    parser.add_argument("--no-warmup", action="store_true",
                        help="time the first step too (a quick fits-in-memory check: peak RSS then includes optimizer state)")
    parser.add_argument("--allow-busy", action="store_true",
                        help=f"run even when the 1-minute load average is above {MAX_LOAD} (timings unreliable)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where the models run")
    parser.add_argument("--backbone", default="llama-2x256", choices=sorted(BACKBONES),
                        help="the backbone under every head (llama-2x256: 2 layers, d = 256; gpt2-small: 12 layers, "
                             "d = 768; gpt2-tiny: its wiring at 2 layers, d = 64)")
    parser.add_argument("--dtype", choices=("fp32", "bf16"),
                        help="fp32, or bf16 autocast (default: bf16 on cuda, fp32 on cpu)")
    parser.add_argument("--loss-dim", type=int, default=2048, help="d of the loss comparison (cuda only)")
    parser.add_argument("--no-loss-peers", action="store_true", help="skip the loss comparison (cuda only)")
    parser.add_argument("--profile", default="",
                        help="comma-separated heads: after timing, one more training step of each under torch.profiler; "
                             "the table then lists its operations with the most device (CUDA) or CPU self time")
    parser.add_argument("--one-worker", action="store_true",
                        help="on a CPU too, every case of one |V| and N in one worker process, as on cuda (a wiring "
                             "check: the peak columns are then the process's, not each case's)")
    parser.add_argument("--out", help="also write the markdown table to this file")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # JSON case, internal
    return parser.parse_args(argv)


def rss_mb(field: str) -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(field)


def build_model(head: str, vocab: int, backbone: str = "llama-2x256"):
    import torch
    import transformers

    from hf_outheads import OutHeadsConfig, OutHeadsForCausalLM

    config_class, fields, _ = BACKBONES[backbone]
    text = getattr(transformers, config_class)(vocab_size=vocab, bos_token_id=1, eos_token_id=2, pad_token_id=0, **fields)
    spec = head_spec(head, HEAD_VARIANTS)  # a head of the package's catalog without a case here: its defaults
    torch.manual_seed(0)
    model = OutHeadsForCausalLM(OutHeadsConfig(text_config=text, head_options=spec.options))
    if head in COMPARED:
        use_reference_mos(model.head)
    return model


def training_step(model, ids, backbone_only: bool = False, bf16: bool = False):
    """One AdamW step (forward with labels, backward, update) of `model` on `ids`; the forward
    under bf16 autocast when `bf16`."""
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=bf16):
            if backbone_only:
                loss = model.backbone(input_ids=ids).last_hidden_state.float().square().mean()
            else:
                loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    model.train()
    return step


def run_case(case: dict) -> dict:
    """Step memory of the case's model alone, then its step time alternating with a `tied`
    model's in this process (`step_vs_tied`), then generation likewise."""
    import torch

    torch.set_num_threads(case["threads"])
    device, bf16 = torch.device(case["device"]), case["dtype"] == "bf16"
    clock = cpu_clock
    if device.type == "cuda":
        from benchmarks.bench_gpu import peak_mb
        from hf_outheads.training.throughput import cuda_clock as clock
    backbone = case.get("backbone", "llama-2x256")
    model = build_model(case["head"], case["vocab"], backbone).to(device)
    seq_len = BACKBONES[backbone][2]
    batch = max(1, case["positions"] // seq_len)
    ids = torch.randint(3, case["vocab"], (batch, seq_len), generator=torch.Generator().manual_seed(0)).to(device)
    step = training_step(model, ids, backbone_only=case["head"] == "backbone", bf16=bf16)
    if case["warmup"]:
        step()  # warm-up: allocates optimizer state
    if device.type == "cuda":
        step_mb, peak = peak_mb(step)
        result = {"step_mb": step_mb, "peak_mb": peak}
    else:
        before = rss_mb("VmRSS")
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")  # reset the peak-RSS counter
        step()
        result = {"step_mb": rss_mb("VmHWM") - before, "peak_mb": rss_mb("VmHWM")}
    tied = build_model("tied", case["vocab"], backbone).to(device)
    result.update(paired_times({"model": step, "tied": training_step(tied, ids, bf16=bf16)}, case["reps"], clock))
    if case.get("profile"):
        result["profile"] = profile_step(step, device)
    if case["gen_tokens"]:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            result.update(generation_rates(model, tied, ids[:1, :16], case, clock))
    return result


PROFILE_ROWS = 12


def profile_step(step, device) -> list[tuple[str, float, int]]:
    """`(operation, self milliseconds, calls)` of one `step()` under torch.profiler, the `PROFILE_ROWS`
    operations with the most self time on the device (CUDA kernels by name), else on the CPU."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        step()
        if device.type == "cuda":
            torch.cuda.synchronize()
    field = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    events = sorted(prof.key_averages(), key=lambda e: getattr(e, field), reverse=True)[:PROFILE_ROWS]
    return [(e.key[:90], getattr(e, field) / 1e3, e.count) for e in events]


def profile_rows(vocab: int, positions: int, results: dict[str, dict]) -> list[str]:
    """The profiled cases' operations, one small table each."""
    rows = []
    for head, r in results.items():
        if r.get("profile"):
            rows += ["", f"Profile of one `{head}` training step, |V| = {vocab}, N = {positions}, self time:", "",
                     "| operation | ms | calls |", "| --- | --- | --- |"]
            rows += [f"| `{name.replace('|', '/')}` | {ms:.2f} | {calls} |" for name, ms, calls in r["profile"]]
    return rows


def paired_medians(calls: dict, reps: int, clock=cpu_clock) -> tuple[float, float]:
    """Median seconds of `calls["model"]` and of `calls["tied"]`, each warmed up, timed
    alternating in the order model, tied, tied, model, ... so that a slower or faster spell of
    the machine, and whatever the call before leaves behind, moves both alike."""
    times = {name: [] for name in calls}
    for rep in range(reps):
        for name, call in list(calls.items())[:: 1 if rep % 2 == 0 else -1]:
            times[name].append(clock(call))
    return statistics.median(times["model"]), statistics.median(times["tied"])


def paired_times(calls: dict, reps: int, clock=cpu_clock) -> dict:
    """`step_s` of `calls["model"]` (already run once) and `step_vs_tied`, `calls["tied"]` run once first."""
    calls["tied"]()
    model_s, tied_s = paired_medians(calls, reps, clock)
    return {"step_s": model_s, "step_vs_tied": model_s / tied_s}


def generation_rates(model, tied, prompt, case: dict, clock=cpu_clock) -> dict:
    """Greedy tokens/s of `model`, and its ratio to `tied`, timed as `paired_medians`."""
    import torch

    def generate(which, tokens: int):
        return lambda: which.generate(prompt, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)

    with torch.no_grad():
        for which in (model.eval(), tied.eval()):
            generate(which, 4)()  # warm-up (and label-matrix cache)
        calls = {"model": generate(model, case["gen_tokens"]), "tied": generate(tied, case["gen_tokens"])}
        model_s, tied_s = paired_medians(calls, case["gen_reps"], clock)
    return {"gen_tok_s": case["gen_tokens"] / model_s, "gen_vs_tied": tied_s / model_s}


def run_cases(cases: list[dict]) -> list[dict]:
    """`run_case` of each case in this process (a CUDA worker: the allocator's statistics are the
    case's own), freeing the models between cases; a failed case gives its error."""
    import gc

    import torch

    results = []
    for case in cases:
        try:
            results.append(run_case(case))
        except Exception as error:  # noqa: BLE001: the table says what failed (out of memory, ...)
            results.append({"error": f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:120]})
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return results


def measure(cases: list[dict]) -> list[dict]:
    """The cases measured in one fresh worker process."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", HF_HUB_OFFLINE="1", OMP_NUM_THREADS=str(cases[0]["threads"]))
    proc = subprocess.run([sys.executable, "-m", "benchmarks.bench_heads", "--worker", json.dumps(cases)],
                          capture_output=True, text=True, env=env, cwd=ROOT)
    if proc.returncode != 0:
        return [{"error": (proc.stderr.strip().splitlines() or ["failed"])[-1][:120]}] * len(cases)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def components(head: str) -> int:
    options = HEAD_VARIANTS.get(head) or {}
    return options.get("num_components") or sum(count for _, count in options.get("components", [])) or 1


def floor_ratio(head: str, r: dict, results: dict[str, dict]) -> str:
    """Step over `backbone + K x (tied - backbone)`, `tied-own`'s step for tied's when it ran (the
    mixtures' kernels); "-" for the backbone or without its step."""
    base = results.get("tied-own", {}).get("step_s") or results["tied"].get("step_s")
    backbone, tied = results.get("backbone", {}).get("step_s"), base
    if head == "backbone" or backbone is None or tied is None or tied <= backbone:  # (a noisy CPU: no head cost)
        return "-"
    return f"{r['step_s'] / (backbone + components(head) * (tied - backbone)):.2f}x"


def table_rows(vocab: int, positions: int, results: dict[str, dict]) -> list[str]:
    base = results["tied"]
    rows = []
    for head, r in results.items():
        if "error" in r:
            rows.append(f"| {vocab} | {positions} | {head} | error: {r['error']} | | | | | | | |")
            continue
        gen = f"{r['gen_tok_s']:.1f} | {r['gen_vs_tied']:.2f}x" if "gen_tok_s" in r else "- | -"
        rows.append(
            f"| {vocab} | {positions} | {head} | {r['step_s']:.3f} | {r['step_vs_tied']:.2f}x | "
            f"{floor_ratio(head, r, results)} | {r['step_mb']:.0f} | {r['step_mb'] / max(base['step_mb'], 1):.2f}x | "
            f"{r['peak_mb']:.0f} | {gen} |"
        )
    return rows


def reference_notes(results: dict[str, dict]) -> list[str]:
    """Each head's step against its reference-style implementation (`mos` vs `mos-reference`)."""
    return [f"<!-- {head} step = {results[head]['step_s'] / r['step_s']:.2f}x {name} -->"
            for name, r in results.items() if name in COMPARED and "step_s" in r
            for head in [COMPARED[name]] if "step_s" in results.get(head, {})]


def check_load(allow_busy: bool) -> float:
    """The 1-minute load average; above `MAX_LOAD` a loud warning, and exit unless `allow_busy`."""
    load = os.getloadavg()[0]
    if load > MAX_LOAD:
        bar = "!" * 78
        print(f"{bar}\nWARNING: 1-minute load average {load:.2f} > {MAX_LOAD}: this machine is busy and the "
              f"timings would\nnot be comparable. Run on an idle machine, or pass --allow-busy to run anyway.\n{bar}",
              file=sys.stderr, flush=True)
        if not allow_busy:
            sys.exit(2)
    return load


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(run_cases(json.loads(args.worker))))
        return
    load = check_load(args.allow_busy)
    dtype = args.dtype or ("bf16" if args.device == "cuda" else "fp32")
    device_name = ""
    if args.device == "cuda":
        from benchmarks.bench_gpu import cuda_device_name

        device_name = f" ({cuda_device_name()})"
    heads = ["tied", "backbone"] + [h for h in args.heads.split(",") if h and h not in ("tied", "backbone")]
    lines = [
        f"<!-- python -m benchmarks.bench_heads {' '.join(sys.argv[1:] if argv is None else argv)}; "
        f"1-minute load average at start {load:.2f}"
        f"{' (BUSY: timings unreliable)' if load > MAX_LOAD else ''}; {args.device}{device_name}, "
        f"{dtype}, backbone {args.backbone} -->",
        "| V | N | head | step s | step vs tied | vs floor | step mem MB | mem vs tied | peak MB | gen tok/s "
        "| gen vs tied |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    print("\n".join(lines), flush=True)
    profiles = []
    for vocab in map(int, args.vocab.split(",")):
        for positions in map(int, args.positions.split(",")):
            cases = [dict(head=head, vocab=vocab, positions=positions, reps=args.reps, threads=args.threads,
                          warmup=not args.no_warmup, device=args.device, dtype=dtype, backbone=args.backbone,
                          gen_tokens=0 if args.no_generate else args.gen_tokens, gen_reps=args.gen_reps,
                          profile=head in args.profile.split(",")) for head in heads]
            if args.device == "cuda" or args.one_worker:  # one worker: the allocator's statistics are per case
                results = dict(zip(heads, measure(cases)))
            else:  # a fresh process per case: its peak RSS is the case's own
                results = {case["head"]: measure([case])[0] for case in cases}
            rows = table_rows(vocab, positions, results) + reference_notes(results)
            print("\n".join(rows), flush=True)
            lines += rows
            profiles += profile_rows(vocab, positions, results)
    print("\n".join(profiles), flush=True)
    lines += profiles
    if args.device == "cuda" and not args.no_loss_peers:
        from benchmarks.bench_gpu import loss_table

        lines += ["", *loss_table(args.vocab, args.positions, args.loss_dim, args.reps)]
    if args.out:
        with open(args.out, "w") as out:
            out.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
