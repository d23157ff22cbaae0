"""Training, evaluation and publishing scripts for hf_outheads models (accelerate, datasets,
tokenizers, evaluate): the repository's `training/` folder, installed as `hf_outheads.training`
(pyproject.toml), its one import name. Entry points: `hf-outheads train | export | quickstart |
mtp-distill` (hf_outheads/tools/cli.py), the scripts by path (`accelerate launch training/train.py`,
`python training/export.py`, ...) or as modules (`python -m hf_outheads.training.train`). A run's
options are declared in `options.py`; the corpora built here, the data sources of `train.py`
(`dataset_name`), are in `corpora/`; the head comparisons are in `studies/`."""

from hf_outheads.training.launching import quiet_deepspeed_cpu_notice

quiet_deepspeed_cpu_notice()  # DeepSpeed's CPU notice, in runs that do not use DeepSpeed
