"""Every head type by name. A new head is one file plus one line here.

Kept as plain `from .head_x import` lines so that `save_pretrained` copies every head
file next to a saved model (remote code follows only single-dot imports).
"""

from __future__ import annotations

from .head_bilinear import BilinearHead
from .head_doc import DOCHead
from .head_drill import DrillHead
from .head_joint import JointHead
from .head_lightrnn import LightRNNHead
from .head_linear import LinearHead
from .head_mos import MoSHead
from .head_sigsoftmax import SigSoftmaxHead
from .head_tied import TiedHead
from .head_interface import OutputHead

HEAD_CLASSES: dict[str, type[OutputHead]] = {
    cls.head_type: cls
    for cls in (
        LinearHead,
        TiedHead,
        BilinearHead,
        JointHead,
        DrillHead,
        MoSHead,
        DOCHead,
        LightRNNHead,
        SigSoftmaxHead,
    )
}


def get_head_class(head_type: str) -> type[OutputHead]:
    try:
        return HEAD_CLASSES[head_type]
    except KeyError:
        raise ValueError(f"Unknown head type {head_type!r}. Valid head types: {sorted(HEAD_CLASSES)}.") from None
