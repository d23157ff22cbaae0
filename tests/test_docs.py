"""What the repository's documents state holds: no path of one machine in a tracked file."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# first folders of an absolute path that every machine has (or a path of the operating system's)
SYSTEM_FOLDERS = {"usr", "etc", "proc", "dev", "tmp", "bin", "sbin", "lib", "lib64", "opt", "var", "sys", "run",
                  "boot", "Library", "System", "Applications"}
ABSOLUTE = re.compile(r"(?P<before>^|[\s`'\"(=:,\[])/(?P<first>[A-Za-z][\w.-]*)/[\w.-]", re.M)
WINDOWS = re.compile(r"\b[A-Za-z]:\\(?:Users|home)\\", re.I)


def tracked_files() -> list[Path]:
    """The files git tracks (every file but .git's, the tests' caches and build outputs where git is missing)."""
    done = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True)
    if done.returncode == 0:
        return [ROOT / name for name in done.stdout.split("\0") if name]
    skip = {".git", "__pycache__", "outputs", ".venv-ci", ".venv-ci-lib", ".venv-ci-floor"}
    return [p for p in ROOT.rglob("*") if p.is_file() and not skip & set(p.relative_to(ROOT).parts)]


def machine_paths(text: str) -> list[str]:
    """Absolute paths of `text` under a first folder no other machine need have (a home, a work folder):
    a regular expression's path (a raw string, `r"/man/..."`) is no path."""
    found = []
    for match in ABSOLUTE.finditer(text):
        start = match.start("before")
        raw_string = match.group("before") in "'\"" and match.group("before") and text[start - 1:start] == "r"
        if match.group("first") not in SYSTEM_FOLDERS and not raw_string:
            found.append(text[match.start("first") - 1:].split()[0][:80])
    return found + WINDOWS.findall(text)


def test_no_tracked_file_holds_a_path_of_one_machine():
    paths = {}
    for path in tracked_files():
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):  # binary files (weights, plots)
            continue
        if found := machine_paths(text):
            paths[str(path.relative_to(ROOT))] = found
    assert paths == {}
    # what it catches (written in pieces: this file is tracked too), and what it leaves alone
    home, work = "/" + "home/someone/x.pdf", "/" + "work/shared/papers/"
    assert machine_paths(f"from `{work}` and C:" + "\\Users\\me") == [work + "`", "C:" + "\\Users\\"]
    assert machine_paths(f"see {home}") == [home]
    assert machine_paths('r"/man/man(\\d)/x" and /tmp/x, /proc/self/status, https://host/a/b, studies/results/a') == []
