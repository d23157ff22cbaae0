"""Training, evaluation and publishing scripts for hf_outheads models (accelerate, datasets,
tokenizers, evaluate). Entry points, run as modules from the repository root:
`python -m training.train` (`accelerate launch -m training.train`), `python -m training.export_plain`,
`python -m training.quickstart`; the head comparisons are in `studies/`. The corpus builders
(`stdlib_corpus.py`, the quickstart's offline corpus, and `manpages_corpus.py`) are data sources of
`train.py` (`dataset_name`)."""
