"""One row per registered head: the options the shared contract tests build it with (tiny
sizes; tests/tiny.py backbones have hidden 32, 2 layers, vocab 99), each head class's
`contract_options`. A new head joins every contract test through its class."""

import sys

from hf_outheads import HEAD_CLASSES

HEAD_CASES = {head_type: cls.contract_options for head_type, cls in HEAD_CLASSES.items()}


class CountedRegistry(dict):
    """`HEAD_CLASSES` that records each lookup of a head class by its name (`[]`, `.get`)."""

    def __init__(self, *args):
        super().__init__(*args)
        self.lookups = []

    def __getitem__(self, key):
        self.lookups.append(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self.lookups.append(key)
        return super().get(key, default)


def counted_lookups(monkeypatch) -> list:
    """The head types looked up in the registry from now on (by every module of the package, through
    `get_head_class` or `HEAD_CLASSES`), in order: the list fills as they are."""
    counted = CountedRegistry(HEAD_CLASSES)
    for name, module in list(sys.modules.items()):
        if name.startswith("hf_outheads") and getattr(module, "HEAD_CLASSES", None) is HEAD_CLASSES:
            monkeypatch.setattr(module, "HEAD_CLASSES", counted)
    return counted.lookups
