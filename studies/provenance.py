"""What produced a study's run: the commit of the code (marked `-dirty` where the package or the
studies had uncommitted changes) and the versions of the packages that train, recorded with every
run the studies train (`produced_by`), so that a later change of training can list exactly the
committed results it invalidates (those whose runs name a commit before it)."""

from __future__ import annotations

import functools
import importlib.metadata
import platform
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("torch", "transformers", "accelerate", "datasets", "tokenizers", "evaluate", "triton", "liger-kernel",
            "cut-cross-entropy")
CODE = ("hf_outheads", "studies")  # what a run's numbers depend on, besides the packages


def git(*args: str) -> str | None:
    """git's output in the checkout, or None (no git, no checkout)."""
    try:
        with subprocess.Popen(["git", "-C", str(ROOT), *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True) as process:
            out, _ = process.communicate(timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.strip() if process.returncode == 0 else None


@functools.cache
def produced_by() -> dict:
    """{"commit": the checkout's HEAD (None outside a git checkout), "-dirty" added when `CODE` has
    uncommitted changes; "python"; "versions": {package: version, for those of `PACKAGES` installed}}."""
    commit = git("rev-parse", "HEAD")
    if commit and git("status", "--porcelain", "--", *CODE):
        commit += "-dirty"
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return {"commit": commit, "python": platform.python_version(), "versions": versions}
