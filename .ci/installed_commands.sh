#!/usr/bin/env bash
# CI: the package as users install it (`pip install ".[train]"`, not editable, into the virtualenv that
# is active), then the documented commands from a folder outside the repository, at tiny sizes, and the
# training script by path from the repository root, as accelerate's examples run. A minute or two.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
pip install --quiet "$repo[train]"
away=$(mktemp -d)
trap 'rm -rf "$away"' EXIT
cd "$away"
python -c "import importlib.util as u; assert u.find_spec('training') is None, 'a top-level training module is installed'"
tiny=(--max_steps 2 --eval_steps 2 --save_steps 2 --max_train_samples 60 --max_eval_samples 10
      --tokenizer_vocab_size 300 --sample_max_new_tokens 4)
hf-outheads train --config hf_outheads/training/configs/quickstart_lm.yaml --output_dir outputs/quickstart_lm "${tiny[@]}" \
    --block_size 32 --model_overrides '{n_embd: 32, n_layer: 1, n_head: 2}'
hf-outheads export outputs/quickstart_lm outputs/quickstart_lm_plain
hf-outheads quickstart --output_root quickstart "${tiny[@]}"
python -m hf_outheads.training.train --help >/dev/null
python -m hf_outheads.training.corpora.debian_docs --help >/dev/null  # the corpus builders' subpackage is installed
python "$repo/hf_outheads/training/train.py" --help >/dev/null
cd "$repo"
accelerate launch --num_processes 1 --num_machines 1 --mixed_precision no --dynamo_backend no hf_outheads/training/train.py --help >/dev/null
echo "CI: after pip install \".[train]\", hf-outheads train, export and quickstart ran outside the repository," \
     "and hf_outheads/training/train.py by path (accelerate launch, python)"
