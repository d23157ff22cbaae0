"""Training, evaluation and publishing scripts for hf_outheads models (accelerate, datasets,
tokenizers, evaluate). The repository's `training/` folder, installed as `hf_outheads.training`
(pyproject.toml). Entry points: `hf-outheads train | export | quickstart` (hf_outheads/cli.py), the
scripts by path (`accelerate launch training/train.py`, `python training/export.py`,
`python training/quickstart.py`) or as modules from the repository root (`python -m training.train`);
the head comparisons are in `studies/`. The corpus builders (`stdlib_corpus.py`, the quickstart's
offline corpus, and `manpages_corpus.py`) are data sources of `train.py` (`dataset_name`)."""

from .launching import quiet_deepspeed_cpu_notice

quiet_deepspeed_cpu_notice()  # DeepSpeed's CPU notice, in runs that do not use DeepSpeed
