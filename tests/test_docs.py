"""What the repository's documents state holds: the READMEs' commands and code run as written, and
no tracked file holds a path of one machine."""

from __future__ import annotations

import ast
import builtins
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


def snippets(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_the_training_readme_gives_the_quickstarts_own_command():
    from training.quickstart import TASKS, by_hand_command, launch_command

    training_readme = (ROOT / "training" / "README.md").read_text()
    for task in TASKS:
        output_dir = Path("outputs") / TASKS[task].stem
        by_hand = by_hand_command(task, output_dir, [])
        assert " ".join(by_hand) in training_readme
        launched = launch_command(task, output_dir, [])
        # the same arguments: only the interpreter's accelerate, --quiet, the script as a module (importable
        # without the install) and absolute paths differ
        script = by_hand.index("training/train.py")
        assert [a for a in launched[4:] if a != "--quiet"] == [
            str(ROOT / a) if a.startswith("training/") else a
            for a in [*by_hand[2:script], "-m", "training.train", *by_hand[script + 1:]]]


def unbound_names(code: str) -> set[str]:
    tree = ast.parse(code)
    bound = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return used - bound - set(dir(builtins))


def test_the_readme_python_quickstart_imports_every_name_it_uses():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Quickstart in Python", 1)[1].split("\n## ", 1)[0]
    blocks = snippets(section)
    assert blocks and all(not unbound_names(block) for block in blocks), [unbound_names(b) for b in blocks]
    assert "OutHeadsConfig" in "".join(blocks) and "LlamaConfig" in "".join(blocks)


def test_the_readme_serving_table_lists_every_head_and_installs_each_extra_once():
    from hf_outheads.head_catalog import HEAD_CLASSES as HEADS

    readme = (ROOT / "README.md").read_text()
    table = readme.split("## Serving", 1)[1].split("A refusal is", 1)[0]
    assert all(f"`{head}`" in table for head in HEADS), [h for h in HEADS if f"`{h}`" not in table]
    install = snippets(readme.split("## Install", 1)[1].split("\n## ", 1)[0].replace("```bash", "```python"))[0]
    assert '".[dev]"' in install and '".[train]"' not in install  # [dev] contains [train]
    extras = __import__("tomllib").loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any("train" in dep for dep in extras["dev"])
