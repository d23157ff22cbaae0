"""Head comparisons and ablations (`compare_heads.py`, `reevaluate.py`, `regimes.py`), their
configs and results: research on top of the training code in `hf_outheads/training/`."""
