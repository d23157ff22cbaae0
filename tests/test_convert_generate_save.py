"""examples/convert_generate_save.py runs as written (offline) and checks what it claims."""

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "convert_generate_save.py"


def test_the_python_example_runs(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    run = subprocess.run([sys.executable, str(SCRIPT)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "with head 'tied'" in run.stdout
    assert "(same as the original GPT-2)" in run.stdout
    assert "generated tokens identical" in run.stdout
