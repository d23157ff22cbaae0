#!/usr/bin/env bash
# The GPU work, in commands of at most 10 minutes each (15 minutes of device time in all, the machine's
# start included). Each command continues the scale comparison:
#
#   maintainer/gpu_wheels.sh                # here: the wheels the GPU image lacks, into .whl/
#   python -m hf_outheads.training.corpora.debian_docs data/scale_corpus
#                                      # here: the packed corpus of the scale comparison
#   maintainer/gpu_run.sh "$OUT"            # there, carrying .whl and data/scale_corpus (about 9 min): the next
#                                      #   runs of the scale queue (studies/scale_heads.py: train.py's runs)
#   cp -r OUT/scale/. studies/results/scale_gpt2small/   # here: the queue's state and tables, committed
#
#   maintainer/gpu_run.sh "$OUT" --part bench   # there, when the kernels change (about 7 min): CUDA tests, the
#                                      #   fused losses against their peers, every loss path against tied
#                                      #   (|V| 32K and 128K, and at GPT-2-small shape), train.py compiled
#                                      #   at GPT-2-small shape (tokens/s and MFU beside the study's tied run)
#   maintainer/gpu_run.sh "$OUT" --part vllm    # there, where vLLM is installed (about 5 min): vLLM's served
#                                      #   tokens/s of tied against mos at GPT-2-small shape, 64 requests at
#                                      #   once, CUDA graphs on (benchmarks/bench_serving.py). The image has no
#                                      #   vLLM, and vllm 0.33.0's wheel (336 MB, with torch 2.14) is more than
#                                      #   a call carries: the part says so and stops.
#
# Every call is the same command; it continues the queue from the committed runs, so each call adds
# runs until the comparison is complete (a run predicted to overrun the budget is left for the next
# call). Files written into OUT (a call returns at most 8): scale: scale.log,
# scale/{scale_runs.jsonl,results.md,results.json,speed.md,speed.json}; bench: bench.log, loss.md, heads_32000.md,
# heads_128000.md, heads_gpt2small.md, train.log; vllm: vllm.log, vllm.md. Each step has a time limit, and the scale queue a
# budget (the part's seconds less what it has used), so that each part ends in time; a step that fails
# is logged and the part goes on; the exit status is the number of failed steps.
#
# --tiny (with --part all): both parts end to end on a CPU in minutes (tests/test_gpu_run.py runs it in
# CI). It proves the wiring, not the GPU: the CUDA tests are collected and skipped, the benchmarks run in
# fp32 at tiny sizes, each table's cases in one worker process as on a GPU (liger and cut-cross-entropy
# listed as not runnable), train.py runs compiled at a
# tiny size, and the scale queue trains every head, compiled, as a 1-layer model on a corpus packed from
# the Python standard library's docstrings (the mtp run's drafting speed measured after it, on 2 short prompts).
set -uo pipefail
usage="usage: maintainer/gpu_run.sh OUTDIR [--part scale|bench|vllm|all] [--tiny]"
[ $# -ge 1 ] || { echo "$usage" >&2; exit 2; }
OUT=$(mkdir -p "$1" && cd "$1" && pwd) || { echo "cannot create $1" >&2; exit 2; }
shift
PART=scale TINY=0
while [ $# -gt 0 ]; do
    case "$1" in
        --part) PART=${2:-}; shift 2 ;;
        --tiny) TINY=1; shift ;;
        *) echo "$usage" >&2; exit 2 ;;
    esac
done
case "$PART" in bench|scale|vllm|all) ;; *) echo "$usage" >&2; exit 2 ;; esac
cd "$(dirname "$0")/.."
ROOT=$PWD
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
SCRATCH=$(mktemp -d)  # train.py's run (not a result)
trap 'rm -rf "$SCRATCH"' EXIT

step() {  # step NAME SECONDS COMMAND...: run with a time limit (x LIMIT_SCALE), log it
    local name=$1 limit=$(( $2 * LIMIT_SCALE )); shift 2
    echo "=== $name ($(date -u +%H:%M:%S), limit ${limit}s): $*"
    local start=$SECONDS
    timeout --kill-after=10 "$limit" "$@"
    local rc=$?
    echo  # (a command's last line may lack its newline: the exit line starts a line, which the count below reads)
    echo "=== $name: exit $rc after $((SECONDS - start)) s"
}

install_wheels() {  # the device README's command: wheels into /tmp/site, ahead of the image's packages; then
    # this checkout as a developer installs it (`pip install -e`, no dependencies): the package imports from any
    # folder, with its `hf-outheads` command
    if [ $TINY -eq 1 ]; then return; fi
    if ! ls .whl/*.whl >/dev/null 2>&1; then
        echo "no .whl/*.whl: run maintainer/gpu_wheels.sh here and carry .whl" >&2; exit 3
    fi
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || exit 3
    export PYTHONPATH="/tmp/site:$PYTHONPATH"
    $PY -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir -e . || exit 3
}

environment() {
    echo "=== environment"
    date -u
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv
    $PY - <<'EOF'
import importlib, sys
import torch
print("python", sys.version.split()[0], "| torch", torch.__version__, "| cuda", torch.version.cuda,
      "| device", torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu")
for name in ("transformers", "accelerate", "tokenizers", "datasets", "triton", "liger_kernel", "cut_cross_entropy"):
    try:
        module = importlib.import_module(name)
        print(f"  {name} {getattr(module, '__version__', '?')}")
    except Exception as error:
        print(f"  {name}: {type(error).__name__}: {error}")
if torch.cuda.is_available():
    from hf_outheads.training.throughput import bf16_peak_tflops
    print(f"  dense bf16 peak measured now: {bf16_peak_tflops():.0f} TFLOP/s (8192-cubed product)")
EOF
}

if [ $TINY -eq 1 ]; then
    LIMIT_SCALE=5  # the GPU's limits, stretched for a shared CPU
    TESTS=(tests/test_cuda.py)  # collected and skipped (the kernels' interpreter tests run in the suite)
    VOCABS=(512)  # every head of the catalog
    BENCH=(--device cpu --positions 512 --reps 1 --threads 1 --allow-busy --no-generate --one-worker)
    GPT2=(--device cpu --backbone gpt2-tiny --vocab 512 --positions 512 --reps 1 --threads 1 --allow-busy --no-generate
          --profile mos --one-worker)
    LOSS=(--device cpu --vocab 512 --positions 256 --dim 32 --reps 1 --own_chunk_exponents 12)
    TRAIN=(--model_preset gpt2-tiny --model_overrides '{"n_layer": 1, "n_embd": 32, "n_head": 2}' --block_size 32
           --tokenizer_vocab_size 300 --per_device_train_batch_size 4 --dataloader_num_workers 1 --max_steps 3 --logging_steps 1
           --max_eval_samples 16 --sample_max_new_tokens 4 --mixed_precision no)
    CORPUS=$OUT/tiny_corpus
    SCALE=(--runs "$OUT/no_runs.jsonl" --override n_layer=1 --override n_embd=32 --override n_head=2
           --override train_tokens=1024 --override batch_size=4 --override evaluations=1 --override eval_batch_size=16
           --override eval_blocks=32 --override 'drafting={prompts: 2, prompt_tokens: 8, new_tokens: 8, repeats: 1}')
    SCALE_S=  # no budget: every head trains
    SERVING=(--tiny --allow-busy --reps 1)
else
    LIMIT_SCALE=1
    TESTS=(tests/test_cuda.py tests/test_loss_kernels.py)
    VOCABS=(32000 128000)  # every head of the catalog at the first, the loss paths at issue at the others
    BENCH=(--device cuda --positions 8192 --reps 5 --no-loss-peers --allow-busy --no-generate)
    GPT2=(--device cuda --backbone gpt2-small --vocab 32000,128000 --positions 16384 --reps 5 --no-loss-peers --allow-busy
          --no-generate --profile mos)
    LOSS=(--device cuda --vocab 32000,128000 --positions 8192 --dim 2048 --reps 5 --own_chunk_exponents 24,25,26)
    TRAIN=(--model_preset gpt2-small --block_size 1024 --tokenizer data/scale_corpus --per_device_train_batch_size 32
           --max_steps 30 --logging_steps 10 --max_eval_samples 32 --sample_max_new_tokens 8 --mixed_precision bf16)
    CORPUS=data/scale_corpus  # (relative: the runs record their command)
    SCALE=()
    SCALE_S=520  # the scale part's seconds from its start to the queue's end (the call's limit is 600)
    SERVING=(--device cuda --size gpt2-small --vocab 32000 --prompts 64 --concurrency 64 --reps 3 --allow-busy)
fi

part_bench() {  # correctness on CUDA, then the loss kernels' and heads' measurements, then train.py's speed
    step "CUDA tests" 150 $PY -m pytest -q -p no:cacheprovider "${TESTS[@]}"
    step "fused loss against its peers" 60 $PY -m benchmarks.bench_gpu "${LOSS[@]}" --out "$OUT/loss.md"
    local vocab heads
    heads=tied-own,$($PY -c "from hf_outheads import HEAD_CLASSES; print(','.join(HEAD_CLASSES))")
    for vocab in "${VOCABS[@]}"; do
        step "heads against tied, |V| = $vocab" 60 $PY -m benchmarks.bench_heads --heads "$heads" --vocab "$vocab" \
            "${BENCH[@]}" --out "$OUT/heads_$vocab.md"
        heads=tied-own,linear,sigsoftmax,mos,doc
    done
    step "GPT-2-small shape against tied" 100 $PY -m benchmarks.bench_heads --heads tied-own,sigsoftmax,mos,doc "${GPT2[@]}" \
        --out "$OUT/heads_gpt2small.md"
    TORCH_LOGS=recompiles step "train.py compiled, tied, GPT-2-small shape" 120 $PY -m hf_outheads.training.train \
        --config hf_outheads/training/configs/quickstart_lm.yaml \
        --torch_compile true --save_steps 100000 --resume never --output_dir "$SCRATCH/train" "${TRAIN[@]}" \
        >"$OUT/train.log" 2>&1
    tail -n 5 "$OUT/train.log"
    $PY - "$SCRATCH/train/metrics.jsonl" <<'EOF' || true
import json, sys
from pathlib import Path
final = [json.loads(line) for line in open(sys.argv[1])][-1]  # the run's final event: its rates (throughput.py)
print(f"=== train.py: {final['tokens_per_s']:,.0f} tokens/s, {final['achieved_tflops']:.1f} TFLOP/s, "
      f"{final['train_step_time_s'] * 1e3:.1f} ms a step after the first {final['warm_up_steps']}, "
      + (f"MFU {final['mfu']:.1%} of the {final['peak_tflops']:.0f} TFLOP/s measured peak" if final["mfu"] else "no MFU (CPU)")
      + f", {final['device']}")
runs = Path("studies/results/scale_gpt2small/scale_runs.jsonl").read_text().splitlines()
study = [run for run in map(json.loads, runs) if run["name"] == "tied" and run["device"] == final["device"]]
if study:  # the study's tied run on this kind of card (the loop every run trains with)
    run = study[-1]
    print(f"=== the scale study's tied run on this card: {run['tokens_per_s']:,.0f} tokens/s, MFU {run['mfu']:.1%}: "
          f"train.py at {final['tokens_per_s'] / run['tokens_per_s']:.2f}x its tokens/s")
EOF
}

part_scale() {  # the next runs of the scale queue that fit the part's budget
    if [ $TINY -eq 1 ] && [ ! -f "$CORPUS/corpus.json" ]; then
        step "tiny corpus (stdlib docstrings)" 120 $PY -m hf_outheads.training.corpora.debian_docs "$CORPUS" --stdlib --vocab_size 400 \
            --block_size 32 --validation_percent 10
    fi
    local budget=()
    [ -n "$SCALE_S" ] && budget=(--budget_s $((SCALE_S - (SECONDS - PART_START))))
    step "scale queue" 580 $PY -m studies.scale_heads --data "$CORPUS" --out "$OUT/scale" \
        "${budget[@]}" "${SCALE[@]}"
}

part_vllm() {  # vLLM's served tokens/s, tied against mos (its CUDA graphs on a GPU), where vLLM is installed
    if ! $PY -c "import vllm" >/dev/null 2>&1; then
        echo "=== vLLM is not installed here: nothing to measure (vllm 0.33.0's wheel is 336 MB and needs torch 2.14)"
        return
    fi
    step "vLLM served tokens/s, tied against mos" 420 $PY -m benchmarks.bench_serving --heads tied,mos --servers vllm \
        "${SERVING[@]}" --out "$OUT/vllm.md"
}

TOTAL=0
for part in bench scale vllm; do
    if [ "$PART" = all ] || [ "$PART" = $part ]; then
        {
            PART_START=$SECONDS
            echo "=== maintainer/gpu_run.sh $OUT --part $part$([ $TINY -eq 1 ] && echo ' --tiny')"
            install_wheels
            environment
            part_$part
            echo "=== part $part done after $SECONDS s"
        } 2>&1 | tee "$OUT/$part.log"
        FAILED=$(grep -c '^=== .*: exit [1-9]' "$OUT/$part.log" || true)
        echo "=== part $part: $FAILED failed step(s)" | tee -a "$OUT/$part.log"
        TOTAL=$(( TOTAL + FAILED ))
    fi
done
exit "$TOTAL"
