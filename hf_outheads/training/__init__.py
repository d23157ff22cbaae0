"""Training, evaluation and publishing for hf_outheads models (accelerate, datasets, tokenizers,
evaluate; `pip install "hf_outheads[train]"`). Entry points: `hf-outheads train | quickstart |
mtp-distill` (hf_outheads/tools/cli.py), the scripts by path (`accelerate launch
hf_outheads/training/train.py`, `python hf_outheads/training/mtp_distill.py`) or as modules (`python -m
hf_outheads.training.train`). A run's options are declared in `options.py`, read from flags and YAML
by `declared_flags.py`; the shipped configs are in `configs/`; the corpora built here, the data
sources of `train.py` (`dataset_name`), are in `corpora/`; analytic FLOPs (`flops`) and perplexity by
frequency band (`frequency_bands`) are what runs log beside the loss. The guide is the repository's
training/README.md; the head comparisons are in `studies/`."""

from hf_outheads.training.launching import quiet_deepspeed_cpu_notice

quiet_deepspeed_cpu_notice()  # DeepSpeed's CPU notice, in runs that do not use DeepSpeed
