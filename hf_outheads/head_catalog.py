"""Every head type by name: each `from .head_x import XHead` line below registers one head, in
this order. A new head is one file (its class states its own facts: options, papers,
capabilities, benchmark and test cases; `head_interface.OutputHead`) plus one line here.

Kept as plain `from .head_x import` lines so that `save_pretrained` copies every head file next
to a saved model (remote code follows only single-dot imports).
"""

from __future__ import annotations

from .head_interface import OutputHead
from .head_linear import LinearHead
from .head_tied import TiedHead
from .head_bilinear import BilinearHead
from .head_joint import JointHead
from .head_drill import DrillHead
from .head_mos import MoSHead
from .head_doc import DOCHead
from .head_lightrnn import LightRNNHead
from .head_sigsoftmax import SigSoftmaxHead
from .head_mtp import MTPHead

# the head classes imported above (each names its `head_type`), in the order of their lines
HEAD_CLASSES: dict[str, type[OutputHead]] = {
    value.head_type: value for value in dict(globals()).values()
    if isinstance(value, type) and issubclass(value, OutputHead) and "head_type" in vars(value)
}


def get_head_class(head_type: str) -> type[OutputHead]:
    try:
        return HEAD_CLASSES[head_type]
    except KeyError:
        raise ValueError(f"Unknown head type {head_type!r}. Valid head types: {sorted(HEAD_CLASSES)}.") from None
