"""What the repository's documents state holds: their generated tables are current (a hand edit
fails), the READMEs' commands and code run as written, their figures are in the files they link,
and no tracked file holds a path of one machine."""

from __future__ import annotations

import ast
import builtins
import importlib
import importlib.util
import inspect
import io
import re
import subprocess
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# first folders of an absolute path that every machine has (or a path of the operating system's)
SYSTEM_FOLDERS = {"usr", "etc", "proc", "dev", "tmp", "bin", "sbin", "lib", "lib64", "opt", "var", "sys", "run",
                  "boot", "Library", "System", "Applications",
                  "v1"}  # and the routes of an OpenAI-compatible server (`/v1/completions`), no folder
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
    assert machine_paths('r"/man/man(\\d)/x" and /tmp/x, /proc/self/status, https://host/a/b, studies/results/a, '
                         '`/v1/chat/completions`') == []


def snippets(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_the_training_readme_gives_the_quickstarts_own_command():
    """The by-hand command the README shows trains with the options the quickstart trains with in its process."""
    from hf_outheads.training.quickstart import TASKS, by_hand_command, task_options
    from hf_outheads.training.train import parse_args

    training_readme = (ROOT / "training" / "README.md").read_text()
    for task in TASKS:
        output_dir = Path("outputs") / TASKS[task].stem
        by_hand = by_hand_command(task, output_dir, ["--head_type", "linear"])
        assert " ".join(by_hand_command(task, output_dir, [])) in training_readme
        assert by_hand[:2] == ["hf-outheads", "train"]
        assert task_options({task: output_dir}, ["--head_type", "linear"])[task] == parse_args(by_hand[2:])


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
    section = readme.split("## Convert, generate and save in Python", 1)[1].split("\n## ", 1)[0]
    blocks = snippets(section)
    assert blocks and all(not unbound_names(block) for block in blocks), [unbound_names(b) for b in blocks]
    assert "OutHeadsConfig" in "".join(blocks) and "LlamaConfig" in "".join(blocks)


def test_the_readme_installs_each_extra_once():
    readme = (ROOT / "README.md").read_text()
    install = snippets(readme.split("## Install", 1)[1].split("\n## ", 1)[0].replace("```bash", "```python"))[0]
    assert '".[dev]"' in install and '".[train]"' not in install  # [dev] contains [train]
    extras = __import__("tomllib").loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any("train" in dep for dep in extras["dev"])


def test_every_generated_table_is_current_and_a_hand_edit_fails(tmp_path):
    """README.md's head table, studies/README.md's tables of every run, hf_outheads/README.md's serving
    table, docs/families.md's list of families, regimes.md's and families.md's tables are what
    `python -m maintainer.doc_tables` writes from the head classes and the results files; a figure, a seed
    count or a family edited by hand, in any of them, no longer matches."""
    from maintainer.doc_tables import documents, held_and_current

    tables = {}
    for path in documents():
        for name, held, now in held_and_current(path):
            assert held == now, f"{path.relative_to(ROOT)}: table `{name}` is not current: run python -m maintainer.doc_tables"
            tables[name] = (path, held)
    assert set(tables) == {"heads", "regime_groups", "serving", "regimes", "families", "unbuilt_families", "example_card"}
    edits = {"heads": ("perplexity -5.7% (3/3)", "perplexity -5.7% (1/3)"),
             "regime_groups": ("| -2.2% (3/3) |", "| -2.2% (1/3) |"),
             "serving": ("not at all: a mixture", "exact: a mixture"),
             "regimes": ("| +8.9% (0/3) |", "| +9.9% (0/3) |"), "families": ("`gpt2`, ", "`gpt3`, "),
             "unbuilt_families": ("| unbuildable |", "| exact |")}
    for name, (before, after) in edits.items():
        path, held = tables[name]
        assert before in held, (name, before)
        copy = tmp_path / f"{name}.md"
        copy.write_text(path.read_text().replace(before, after, 1))
        assert [name for name, held, now in held_and_current(copy) if held != now] == [name]


def test_every_regime_is_in_one_group_of_studies_tables():
    from studies.regimes import REGIMES
    from maintainer.doc_tables import REGIME_GROUPS

    grouped = [folder for folders in REGIME_GROUPS.values() for folder in folders]
    assert sorted(grouped) == sorted(REGIMES) and all(len(folders) <= 5 for folders in REGIME_GROUPS.values())


def test_the_tables_seed_counts_and_the_readmes_choice_come_from_each_seeds_results(tmp_path, monkeypatch):
    """A verdict's seed count is counted from the per-seed results: one seed of `mos` made worse than
    `linear`'s in regime_scratch's results.json turns its "(3/3)" into "(2/3)" in studies/README.md's
    table. README.md's row of a head shows where it gained most at every seed: one seed of `mos` made
    worse in regime_restore_finetune moves it to regime_finetune. `rewrite` puts the new tables
    between the markers and leaves the rest."""
    import json
    import shutil

    import maintainer.doc_tables as doc_tables
    from studies.regimes import RESULTS

    results = tmp_path / "results"
    shutil.copytree(RESULTS, results, ignore=shutil.ignore_patterns("*.png"))
    for folder in ("regime_scratch", "regime_restore_finetune"):
        saved = json.loads((results / folder / "results.json").read_text())
        rows = {row["name"]: row for row in saved["rows"]}
        rows["mos"]["per_seed"]["eval_perplexity"]["1"] = rows["linear"]["per_seed"]["eval_perplexity"]["1"] + 1.0
        (results / folder / "results.json").write_text(json.dumps(saved))
    monkeypatch.setattr(doc_tables, "RESULTS", results)
    mos = lambda table: next(line for line in table.splitlines() if line.startswith("| `mos` "))

    studies = tmp_path / "studies.md"
    studies.write_text((ROOT / "studies" / "README.md").read_text())
    [(name, held, now)] = doc_tables.held_and_current(studies)
    assert name == "regime_groups" and "| -2.2% (3/3) |" in mos(held) and "| -2.2% (2/3) |" in mos(now)

    readme = tmp_path / "README.md"
    readme.write_text((ROOT / "README.md").read_text())
    [(name, held, now)] = doc_tables.held_and_current(readme)
    assert name == "heads" and "regime_restore_finetune" in mos(held) and "perplexity -9.5% (3/3)" in mos(held)
    assert "regime_restore_finetune" not in mos(now) and "regime_finetune/" in mos(now), mos(now)
    assert "perplexity -5.2% (3/3)" in mos(now)
    assert doc_tables.rewrite(readme) == ["heads"]
    text = readme.read_text()
    assert doc_tables.held_and_current(readme)[0][1] == now.strip() and "## Serving" in text and "# hf_outheads" in text
    assert text.replace(mos(now), mos(held)) == (ROOT / "README.md").read_text()


def test_a_head_that_never_beats_its_reference_at_every_seed_says_no_gain_measured():
    from maintainer.doc_tables import head_table

    mtp = next(line for line in head_table().splitlines() if line.startswith("| `mtp` "))
    better, seeds = map(int, re.search(r"perplexity [+-]\d+\.\d% \((\d+)/(\d+)\)", mtp).groups())
    assert "no gain measured (closest: " in mtp and better < seeds  # (its closest run: better at some seeds, not all)


FIGURE = re.compile(r"[-+]?\d+(?:[.,]\d+)*(?:%|x)?")


def figures_not_in_links(text: str, base) -> tuple[list[str], list[str]]:
    """(the links of `text` to files, the figures of `text` that none of those files holds)."""
    links = [link for link in re.findall(r"\]\(([^)#]+)", text) if not link.startswith("http")]
    linked = "".join((base / link).read_text() for link in links)
    return links, [figure for figure in FIGURE.findall(text) if figure not in linked]


def test_every_figure_of_the_readmes_performance_summary_is_in_the_results_it_links():
    """README.md's performance summary: no figure copied by hand without its source (the benchmark
    results it links)."""
    readme = (ROOT / "README.md").read_text()
    performance = readme.split("\n## Performance", 1)[1].split("\n## ", 1)[0]
    links, missing = figures_not_in_links(performance, ROOT)
    assert links and missing == [] and len(FIGURE.findall(performance)) > 20, (links, missing)
    assert figures_not_in_links(performance.replace("1.05x", "9.87x"), ROOT)[1] == ["9.87x"]  # it catches one


def markdown_files() -> list[Path]:
    return [path for path in tracked_files() if path.suffix == ".md"]


def outside_code(text: str) -> str:
    """`text` without its fenced code blocks (a link or heading there is code)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but `-` and `_` dropped, spaces as `-`."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    found, seen = set(), {}
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", outside_code(text), flags=re.M):
        base = slug(heading)
        found.add(base if base not in seen else f"{base}-{seen[base]}")
        seen[base] = seen.get(base, 0) + 1
    return found


def broken_links(path: Path, text: str) -> list[str]:
    """The relative links of a Markdown file that lead to no file or folder, or to no heading of it."""
    broken = []
    for link in re.findall(r"\]\(([^)\s]+)\)", outside_code(text)):
        if re.match(r"[a-z]+:", link) or "{{" in link:  # a URL, or a template's field
            continue
        target, _, anchor = link.partition("#")
        where = (path.parent / target).resolve() if target else path
        if not where.exists():
            broken.append(link)
        elif anchor and where.suffix == ".md" and anchor not in anchors(where.read_text()):
            broken.append(link)
    return broken


def test_every_relative_link_of_every_markdown_file_resolves(tmp_path):
    broken = {str(path.relative_to(ROOT)): found for path in markdown_files()
              if (found := broken_links(path, path.read_text()))}
    assert broken == {}
    # what it catches: a missing file, a missing heading; and GitHub's slugs
    page = tmp_path / "page.md"
    page.write_text("## Serving: export as a plain model (`mtp`)\n\n## Tests\n\n## Tests\n")
    text = "[a](page.md#serving-export-as-a-plain-model-mtp) [b](page.md#tests-1) [c](nothing.md) [d](page.md#none)"
    assert broken_links(tmp_path / "x.md", text) == ["nothing.md", "page.md#none"]
    assert broken_links(tmp_path / "x.md", "```\n[e](nothing.md)\n```\n[f](https://host/x.md)") == []


def table_widths(text: str) -> list[int]:
    """The number of columns of each Markdown table of `text` (from its separator line)."""
    return [line.count("|") - 1 for line in outside_code(text).splitlines() if re.fullmatch(r"\|(?: *:?-+:? *\|)+", line)]


def test_the_readme_is_short_and_its_tables_narrow():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    assert table_widths(readme) and max(table_widths(readme)) <= 6, table_widths(readme)
    assert table_widths("| a | b |\n| --- | --- |\n|x|y|\n\n|a|b|c|\n|---|---|---|\n") == [2, 3]


# words about how the project is run, not about the software
RUN_WORDS = r"\blease|\bGPU window|\bwindow is \d+ minutes|\bissue #?\d+|\bqueue filled"  # never in a page nor in code
PROCESS_WORDS = re.compile(rf"{RUN_WORDS}|\bsession\b", re.I)  # a page's words (code has POSIX and pytest sessions)
CODE_PROCESS_WORDS = re.compile(RUN_WORDS, re.I)
CODE_FILES = {".py", ".sh", ".yaml", ".yml", ".toml", ".cfg"}


def pages() -> list[Path]:
    """The pages a user reads: every README, the docs/ pages and the studies' guide to the heads."""
    return [path for path in markdown_files() if path.name == "README.md" or path.parts[-2] == "docs"
            or path == ROOT / "studies" / "results" / "regimes.md"]


def test_no_page_speaks_of_how_the_project_is_run():
    found = {str(path.relative_to(ROOT)): PROCESS_WORDS.findall(path.read_text()) for path in pages()}
    assert {path: words for path, words in found.items() if words} == {}
    assert len(pages()) >= 10 and ROOT / "docs" / "heads.md" in pages()
    said = "a queue filled lease by lease; A lent GPU's window is 15 minutes; since issue 48; this session ran"
    assert PROCESS_WORDS.findall(said) == ["queue filled", "lease", "lease", "window is 15 minutes", "issue 48",
                                           "session"]


def code_files() -> list[Path]:
    """The tracked code (the package, training, studies, benchmarks, tools, tests, CI) and the studies' notes, but
    this file, which spells the words out."""
    return [path for path in tracked_files() if (path.suffix in CODE_FILES or path.parent.name == ".ci"
            or path.suffix == ".md" and path not in pages()) and path != Path(__file__).resolve()]


def test_no_comment_or_docstring_speaks_of_how_the_project_is_run():
    """Code says what it does: not which issue asked for it, nor how GPU time is handed out (git has the history)."""
    found = {}
    for path in code_files():
        if words := CODE_PROCESS_WORDS.findall(path.read_text()):
            found[str(path.relative_to(ROOT))] = words
    assert found == {}
    assert ROOT / "hf_outheads" / "model_io.py" in code_files() and ROOT / ".ci" / "run" in code_files()
    assert CODE_PROCESS_WORDS.findall("# Issue 47, item 3: kept; one per lease; a pytest session") == [
        "Issue 47", "lease"]


def test_the_readme_names_the_heads_that_return_log_probabilities():
    from hf_outheads import HEAD_CLASSES

    readme = (ROOT / "README.md").read_text()
    said = readme.split("**Mixture heads return log-probabilities.**", 1)[1].split("`logits`", 1)[0]
    named = set(re.findall(r"`(\w+)`", said))
    assert named == {name for name, cls in HEAD_CLASSES.items() if cls.returns_log_probs}


# names in the package's, training's and the studies' docstrings and comments, as `module.function` or `Class.attr`
DOTTED = re.compile(r"`([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?:\(\))?`")
FILE_ENDINGS = {"py", "yaml", "yml", "json", "jsonl", "md", "txt", "pt", "safetensors", "png", "csv", "toml", "sh", "log",
                "xz", "gz", "whl", "gguf"}
LIBRARIES = ("transformers", "torch", "torch.nn", "accelerate", "datasets", "trl", "peft", "huggingface_hub")
FOLDERS = {"hf_outheads": "hf_outheads", "hf_outheads/tools": "hf_outheads.tools", "hf_outheads/training": "hf_outheads.training",
           "hf_outheads/training/corpora": "hf_outheads.training.corpora", "studies": "studies"}


def project_modules() -> dict[str, str]:
    """file stem -> import name, for every module of FOLDERS (how a docstring names one: `run.train_in_process`)."""
    return {path.stem: f"{package}.{path.stem}" for folder, package in FOLDERS.items()
            for path in sorted((ROOT / folder).glob("*.py")) if path.stem != "__init__"}


def prose(source: str) -> list[str]:
    """The docstrings and comments of `source`."""
    nodes = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    texts = [ast.get_docstring(node, clean=False) or "" for node in ast.walk(ast.parse(source)) if isinstance(node, nodes)]
    return texts + [token.string for token in tokenize.generate_tokens(io.StringIO(source).readline)
                    if token.type == tokenize.COMMENT]


def bound_names(source: str) -> set[str]:
    """The names `source` binds as arguments or variables (`options` may be a variable there, not the module)."""
    tree = ast.walk(ast.parse(source))
    return {node.arg if isinstance(node, ast.arg) else node.id for node in tree
            if isinstance(node, ast.arg) or isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)}


def has(holder, name: str) -> bool:
    """Whether `holder` (a module or a class) has `name`: an attribute, a submodule, a dataclass field or annotation,
    or an attribute its methods set (`self.name`)."""
    if hasattr(holder, name):
        return True
    if inspect.ismodule(holder):
        return hasattr(holder, "__path__") and importlib.util.find_spec(f"{holder.__name__}.{name}") is not None
    for cls in inspect.getmro(holder) if inspect.isclass(holder) else ():
        if name in getattr(cls, "__dataclass_fields__", {}) or name in getattr(cls, "__annotations__", {}):
            return True
        try:
            if re.search(rf"\bself\.{name}\b", inspect.getsource(cls)):
                return True
        except (OSError, TypeError):  # a class without source (a builtin's)
            pass
    return False


def resolves(name: str, namespace: dict, variables: set[str], modules: dict[str, str], defined: dict) -> bool:
    """Whether the dotted `name` of a docstring or comment names something that exists. Its first part is a module
    of the project (`run`), a name of the file (`namespace`) or of the project (`ModelOptions`), a class of the
    libraries (`PreTrainedModel`) or an installed module (`transformers`); anything else (`model.generate`, a
    variable) is not judged, nor a file name (`train_config.yaml`)."""
    first, *rest = name.split(".")
    if rest[-1] in FILE_ENDINGS:
        return True
    if first in modules:
        holder = importlib.import_module(modules[first])
    elif first in namespace or first in defined:
        holder = namespace.get(first, defined.get(first))
    elif first[0].isupper() and not first.isupper():
        holder = next((getattr(importlib.import_module(library), first) for library in LIBRARIES
                       if first in dir(importlib.import_module(library))), None)
        if holder is None:
            return False
    elif first not in variables and importlib.util.find_spec(first) is not None:
        holder = importlib.import_module(first)
    else:
        return True
    for part in rest:
        if not has(holder, part):
            return first in variables and first in modules  # `options.data`: the variable, not the module
        if inspect.ismodule(holder) and not hasattr(holder, part):
            holder = importlib.import_module(f"{holder.__name__}.{part}")
        else:
            holder = getattr(holder, part, None)
        if holder is None:  # a field without a class-level value: what follows is not judged
            return True
    return True


def unresolved_names(source: str, namespace: dict, modules: dict[str, str], defined: dict) -> list[str]:
    variables = bound_names(source)
    return sorted({name for text in prose(source) for name in DOTTED.findall(text)
                   if not resolves(name, namespace, variables, modules, defined)})


def test_every_dotted_name_in_a_docstring_or_comment_exists():
    """A docstring or comment of the package, training/ or studies/ that names `module.function` or `Class.attr`
    names something that exists (a renamed or removed function leaves none behind)."""
    modules = project_modules()
    loaded = {stem: importlib.import_module(name) for stem, name in modules.items()}
    defined = {}  # the classes and functions of the project, by name
    for module in loaded.values():
        defined.update({key: value for key, value in vars(module).items() if inspect.isclass(value) or
                        inspect.isfunction(value) and value.__module__.startswith(("hf_outheads", "studies"))})
    found = {}
    for stem, module in loaded.items():
        path = Path(module.__file__)
        if names := unresolved_names(path.read_text(), vars(module), modules, defined):
            found[str(path.relative_to(ROOT))] = names
    assert found == {}
    assert len(loaded) > 60 and {"run", "scale_heads", "export_plain", "modeling_outheads"} <= set(loaded)
    made_up = ('"""Trains in this process (`train.train_in_process`, `run.train_in_process`), the head from\n'
               '`TrainOptions.head_spec` (`ModelOptions.head_spec`, `ModelOptions.no_such_option`)."""\n'
               'def f(options):\n    return options.model  # `options.model.head`, `model.generate`, `torch.no_such`\n')
    assert unresolved_names(made_up, {}, modules, defined) == [
        "ModelOptions.no_such_option", "TrainOptions.head_spec", "torch.no_such", "train.train_in_process"]
