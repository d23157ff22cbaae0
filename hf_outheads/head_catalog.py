"""Every head type of the package: each `from .head_x import XHead` line below imports one head
file, whose class registers itself (`head_interface.register_head`), in this order. A new head is
one file (its class states its own facts: options, papers, capabilities, benchmark and test
cases; `head_interface.OutputHead`) plus one line here.

Plain `from .head_x import` lines, the only imports transformers' code copier follows: a model's
`save_pretrained` rewrites this file in the saved folder to the lines of that model's heads
(`folders.runtime_code_only`), and the folder carries those head files alone.
"""

from .head_interface import HEAD_CLASSES, get_head_class  # the registry the lines below fill
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
