"""One row per registered head: the options the shared contract tests build it with (tiny
sizes; tests/tiny.py backbones have hidden 32, 2 layers, vocab 99), each head class's
`contract_options`. A new head joins every contract test through its class."""

from hf_outheads import HEAD_CLASSES

HEAD_CASES = {head_type: cls.contract_options for head_type, cls in HEAD_CLASSES.items()}
