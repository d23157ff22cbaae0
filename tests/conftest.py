import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ["OMP_NUM_THREADS"] = "1"  # subprocesses (training runs) inherit one thread per process

import torch  # noqa: E402

if not torch.cuda.is_available():  # the fused losses' Triton kernels run in Triton's interpreter (tests/test_loss_kernels.py);
    os.environ.setdefault("TRITON_INTERPRET", "1")  # read when Triton is first imported, which must come after this

from downloads import pytest_configure, pytest_runtest_makereport  # noqa: E402, F401  (the `downloads` marker)

torch.set_num_threads(1)  # one thread per test process: tiny models gain nothing from more
