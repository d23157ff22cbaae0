#!/usr/bin/env bash
# All of the GPU work of issue 31, as three calls of under 10 minutes each on one H200:
#
#   benchmarks/gpu_wheels.sh                      # here: the wheels the GPU image lacks, into .whl/
#   python -m studies.scale_corpus data/scale_corpus   # here: the packed corpus of the scale comparison
#   benchmarks/gpu_run.sh OUT --part 1            # there, carrying .whl and data/scale_corpus:
#   benchmarks/gpu_run.sh OUT --part 2            #   1: CUDA tests, every head against tied (|V| 32K, 128K)
#   benchmarks/gpu_run.sh OUT --part 3            #   2: fused-loss peers, FSDP2 launch, scale: tied, sigsoftmax, linear
#                                                 #   3: scale: mos, mos K = 1, then lightrnn, drill-own, doc as time allows
#   python -m studies.scale_heads --tabulate OUT2/scale2/scale_runs.jsonl OUT3/scale3/scale_runs.jsonl \
#       --out studies/results/scale_gpt2small    # here: one table of both calls' runs
#
# Files written into OUT (each part at most 6; a call returns at most 8): part1.log,
# bench_32000.md, bench_128000.md; part2.log, loss.md, fsdp.log,
# scale2/{scale_runs.jsonl,results.md,results.json}; part3.log, scale3/{...}. Each step has a
# time limit and the scale comparison a budget, the part's 530 s less what the part has used
# (a head predicted, after 10 steps, to end past it is given up and says so), so that each
# part ends in about 9 minutes on an H200.
# Estimates: bench workers ~15-20 s each (11 heads a vocabulary); GPT-2 small, 30M tokens:
# 2.3e16 FLOPs a single-softmax head (~100 s at 30% of the H200's ~790 TFLOP/s), 8.7e16 mos
# K = 15 (~370 s), 1.1e17 doc (~460 s: it fits only if the others ran faster).
# A step that fails is logged and the part goes on; the exit status is the number of failed steps.
#
# --tiny: every part end to end on a CPU in minutes (tests/test_gpu_run.py runs it in CI). It
# proves the wiring, not the GPU: the CUDA tests are collected and skipped, the benchmark and
# the loss comparison run in fp32 on tiny sizes (liger and cut-cross-entropy are listed as not
# installed), the FSDP2 launch must stop with train.py's message, once, and no output folder (accelerate runs FSDP on
# accelerators only; the sharding itself is tests/test_fsdp.py's), and the scale comparison trains a 1-layer model on
# a corpus packed from the Python standard library's docstrings.
set -uo pipefail
usage="usage: benchmarks/gpu_run.sh OUTDIR [--part 1|2|3|all] [--tiny]"
[ $# -ge 1 ] || { echo "$usage" >&2; exit 2; }
OUT=$(mkdir -p "$1" && cd "$1" && pwd) || { echo "cannot create $1" >&2; exit 2; }
shift
PART=all TINY=0
while [ $# -gt 0 ]; do
    case "$1" in
        --part) PART=${2:-}; shift 2 ;;
        --tiny) TINY=1; shift ;;
        *) echo "$usage" >&2; exit 2 ;;
    esac
done
case "$PART" in 1|2|3|all) ;; *) echo "$usage" >&2; exit 2 ;; esac
cd "$(dirname "$0")/.."
ROOT=$PWD
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
SCRATCH=$(mktemp -d)  # the FSDP runs' models (not results)
trap 'rm -rf "$SCRATCH"' EXIT
FAILED=0

step() {  # step NAME SECONDS COMMAND...: run with a time limit (x LIMIT_SCALE), log, count a failure
    local name=$1 limit=$(( $2 * LIMIT_SCALE )); shift 2
    echo "=== $name ($(date -u +%H:%M:%S), limit ${limit}s): $*"
    local start=$SECONDS
    timeout --kill-after=10 "$limit" "$@"
    local rc=$?
    echo "=== $name: exit $rc after $((SECONDS - start)) s"
    [ $rc -eq 0 ] || FAILED=$((FAILED + 1))
}

install_wheels() {  # the device README's command: wheels into /tmp/site, ahead of the image's packages
    if [ $TINY -eq 1 ]; then return; fi
    if ! ls .whl/*.whl >/dev/null 2>&1; then
        echo "no .whl/*.whl: run benchmarks/gpu_wheels.sh here and carry .whl" >&2; exit 3
    fi
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || exit 3
    export PYTHONPATH="/tmp/site:$PYTHONPATH"
}

environment() {
    echo "=== environment"
    date -u
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv
    $PY - <<'EOF'
import importlib, importlib.metadata as md, sys
import torch
print("python", sys.version.split()[0], "| torch", torch.__version__, "| cuda", torch.version.cuda,
      "| device", torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu")
for name in ("transformers", "accelerate", "tokenizers", "datasets", "triton", "liger_kernel", "cut_cross_entropy",
             "pyarrow", "huggingface_hub", "safetensors"):
    try:
        module = importlib.import_module(name)
        print(f"  {name} {getattr(module, '__version__', '?')} ({module.__file__})")
    except Exception as error:
        print(f"  {name}: {type(error).__name__}: {error}")
import hf_outheads
print("  hf_outheads from", hf_outheads.__file__)
EOF
}

if [ $TINY -eq 1 ]; then
    LIMIT_SCALE=5  # the GPU's limits, stretched for a shared CPU
    DEVICE=cpu
    VOCABS=(512)
    BENCH=(--device cpu --positions 512 --reps 1 --gen-tokens 2 --gen-reps 1 --threads 1 --allow-busy)
    LOSS=(--device cpu --vocab 512 --positions 256 --dim 32 --reps 1)
    FSDP_ARGS=(--max_steps 2 --eval_steps 2 --logging_steps 1 --block_size 32 --tokenizer_vocab_size 300
               --per_device_train_batch_size 4 --mixed_precision no --max_eval_samples 64 --sample_max_new_tokens 4)
    CORPUS=$OUT/tiny_corpus
    SCALE=(--override n_layer=1 --override n_embd=32 --override n_head=2 --override train_tokens=1024
           --override batch_size=4 --override evaluations=1 --override eval_batch_size=16
           --override eval_blocks=32)
    PART_S=  # no budget: every head trains
else
    LIMIT_SCALE=1
    DEVICE=cuda
    VOCABS=(32000 128000)
    BENCH=(--device cuda --positions 8192 --reps 5 --gen-reps 3 --no-loss-peers --allow-busy)
    LOSS=(--device cuda --vocab 32000,128000 --positions 8192,16384 --dim 2048 --reps 5)
    FSDP_ARGS=(--model_preset gpt2-small --block_size 1024 --per_device_train_batch_size 8 --max_steps 20
               --eval_steps 20 --logging_steps 5 --mixed_precision bf16)
    CORPUS=$ROOT/data/scale_corpus
    SCALE=()
    PART_S=530  # a part's seconds from its start to the scale comparison's end (the call's limit is 600)
fi

part1() {  # CUDA tests; every head of the package's catalog against tied (and mos against the published MoS code)
    step "CUDA tests" 120 $PY -m pytest -q -p no:cacheprovider tests/test_cuda.py
    local heads vocab
    heads=$($PY -c "from hf_outheads import HEAD_CLASSES; print(','.join(HEAD_CLASSES))"),mos-reference
    for vocab in "${VOCABS[@]}"; do
        step "benchmark, every head against tied, |V| = $vocab" 230 $PY -m benchmarks.bench_heads --heads "$heads" \
            --vocab "$vocab" "${BENCH[@]}" --out "$OUT/bench_$vocab.md"
    done
}

part2() {  # the fused-loss peers; a one-process FSDP2 launch through accelerate (tied: the head shares E's
           # sharding group; tests/test_fsdp.py covers every head on two CPU processes); the scale comparison's first heads
    step "fused loss against its peers" 110 $PY -m benchmarks.bench_gpu "${LOSS[@]}" --out "$OUT/loss.md"
    for head in tied; do
        local launch=($PY -m accelerate.commands.launch --config_file training/accelerate_fsdp2.yaml
            --num_processes 1 -m training.train --config training/configs/quickstart_lm.yaml --head_type "$head"
            --save_steps 100000 --resume never --output_dir "$SCRATCH/fsdp_$head" "${FSDP_ARGS[@]}")
        if [ "$DEVICE" = cpu ]; then  # accelerate runs FSDP on accelerators only: train.py must stop, not train unsharded
            step "FSDP2 launch, $head: refused on a CPU" 150 bash -c \
                '! "${@:2}" >"$1" 2>&1 && [ "$(grep -c "asks for FSDP sharding" "$1")" = 1 ] && [ ! -e "${1%.log}" ]' \
                _ "$SCRATCH/fsdp_$head.log" "${launch[@]}"
            grep -h "asks for FSDP sharding" "$SCRATCH/fsdp_$head.log" | tail -n 1
        else
            step "FSDP2 launch, $head" 150 "${launch[@]}"
            grep -h '"event": "start"\|"event": "final"' "$SCRATCH/fsdp_$head/metrics.jsonl"
            step "FSDP2 launch, $head: accelerate's distributed type is FSDP" 10 \
                grep -q '"distributed_type": "FSDP"' "$SCRATCH/fsdp_$head/metrics.jsonl"
        fi
    done 2>&1 | tee "$OUT/fsdp.log"
    scale 2 "tied,sigsoftmax,linear"
}

part3() {
    scale 3 "mos,mos-k1,lightrnn,drill-own,doc"
}

scale() {  # scale PART HEADS: the heads in order, each given up if it would end after PART_S
    if [ $TINY -eq 1 ] && [ ! -f "$CORPUS/corpus.json" ]; then
        step "tiny corpus (stdlib docstrings)" 120 $PY -m studies.scale_corpus "$CORPUS" --stdlib --vocab_size 400 \
            --block_size 32 --validation_percent 10
    fi
    local part=$1 heads=$2 budget=()
    [ -n "$PART_S" ] && budget=(--budget_s $((PART_S - (SECONDS - PART_START))))
    step "scale comparison, part $part" 540 $PY -m studies.scale_heads --data "$CORPUS" --heads "$heads" \
        --out "$OUT/scale$part" --device $DEVICE "${budget[@]}" "${SCALE[@]}"
}

for part in 1 2 3; do
    if [ "$PART" = all ] || [ "$PART" = $part ]; then
        {
            PART_START=$SECONDS
            echo "=== benchmarks/gpu_run.sh $OUT --part $part$([ $TINY -eq 1 ] && echo ' --tiny')"
            install_wheels
            environment
            part$part
            echo "=== part $part done: $FAILED failed step(s), $SECONDS s"
        } 2>&1 | tee "$OUT/part$part.log"
        FAILED=$(grep -c '^=== .*: exit [1-9]' "$OUT/part$part.log" || true)
        TOTAL=$(( ${TOTAL:-0} + FAILED )); FAILED=0
    fi
done
exit "${TOTAL:-0}"
