"""Training, evaluation and publishing scripts for hf_outheads models (accelerate, datasets,
tokenizers, evaluate). Entry points: `training/train.py`, `training/compare_heads.py`,
`python -m training.quickstart`."""
