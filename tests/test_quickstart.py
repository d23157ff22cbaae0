"""examples/quickstart.py runs as written (offline) and checks what it claims."""

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "quickstart.py"


def test_quickstart_runs(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    run = subprocess.run([sys.executable, str(SCRIPT)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "with head 'tied'" in run.stdout
    assert "(same as the original GPT-2)" in run.stdout
    assert "generated tokens identical" in run.stdout


def test_training_quickstart_with_a_wrong_option_fails_in_one_message(tmp_path):
    """`python -m training.quickstart` passes extra options to train.py: a wrong one is one line
    from train.py and one from the quickstart, with no traceback from it or the launcher."""
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    run = subprocess.run([sys.executable, "-m", "training.quickstart", "--task", "lm", "--output_root", str(tmp_path),
                          "--head_type", "softmaxx"], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode != 0 and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert "train.py: error: Unknown head type 'softmaxx'" in run.stderr
    assert run.stderr.strip().splitlines()[-1] == "=== quickstart lm failed (exit status 1)"
