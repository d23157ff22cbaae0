"""Training, evaluation and publishing scripts for hf_outheads models (accelerate, datasets,
tokenizers, evaluate). Entry points: `training/train.py`, `training/export_plain.py`,
`python -m training.quickstart`; the head comparisons are in `studies/`. The corpus builders
(`stdlib_corpus.py`, the quickstart's offline corpus, and `manpages_corpus.py`) are data sources of
`train.py` (`dataset_name`)."""
