import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ["OMP_NUM_THREADS"] = "1"  # subprocesses (training runs) inherit one thread per process

import torch  # noqa: E402

if not torch.cuda.is_available():  # Triton's kernels run in its interpreter (tests/test_loss_kernels.py); Triton reads
    os.environ.setdefault("TRITON_INTERPRET", "1")  # it when imported, which `import hf_outheads` (torch) may do first

from downloads import pytest_configure, pytest_runtest_makereport  # noqa: E402, F401  (the `downloads` marker)

collect_ignore = ["vendor"]  # transformers' test modules, run by tests/test_transformers_common.py

torch.set_num_threads(1)  # one thread per test process: tiny models gain nothing from more
