"""Stub: generation is tested by tests/test_generate.py, not by transformers' `GenerationTesterMixin`."""


class GenerationTesterMixin:
    pass
