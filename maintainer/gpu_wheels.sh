#!/usr/bin/env bash
# Download into .whl/ the wheels the GPU machine lacks (its image: Python 3.12, torch 2.11,
# transformers 5.17, accelerate 1.15, triton 3.6, tokenizers 0.23.2, ...), with the device README's
# pip command.
# maintainer/gpu_run.sh installs them there first. Run here, where PyPI is reachable:
#     maintainer/gpu_wheels.sh            # then carry `.whl` (and data/scale_corpus) with each call
# Each name is pinned: one version of each (two stop the install). What each is for:
#   transformers 5.24       the package's floor (pyproject.toml); the image has 5.17
#   liger-kernel, cut-cross-entropy   the fused-loss peers of benchmarks/bench_gpu.py
#   datasets, dill, multiprocess       hf_outheads/training/train.py (the FSDP2 launch) imports datasets
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=(transformers==5.24.0 liger-kernel==0.8.5 cut-cross-entropy==25.1.1
        datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19)
mkdir -p .whl
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${WHEELS[@]}"
du -ch .whl/*.whl | tail -1
