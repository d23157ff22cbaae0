"""The model card template of every card the package renders (`hf_outheads/tools/model_card.py`), installed
as `hf_outheads.model_cards` (pyproject.toml)."""
