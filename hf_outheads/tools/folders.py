"""How the package writes folders. The one rule for a command that writes a folder: the target is
never a source. A target that is, contains or lies inside a folder or file the command reads
(`check_target`: resolved paths, symlinks followed) is refused before anything is written. A folder
written whole (`staged_folder`) is written beside the target and then swapped in, so the target
holds either its old content or the complete new one, and nothing but the target and the staging
folders beside it is touched; without leave to replace the target, a target that another writer
filled after the check is refused at the swap, left as it is. A model saved over an earlier save
(`save_then_swap`) is written inside it first and moved in once complete, and its code files are
its runtime alone (`runtime_code_only`).
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path


logger = logging.getLogger(__name__)


class TargetIsSource(ValueError):
    """A command's target folder is, contains or lies inside what the command reads."""


def check_target(target, sources=(), what: str = "The output folder") -> Path:
    """`target` resolved; `TargetIsSource` naming both when it is, contains or lies inside one of
    `sources` (paths that do not exist are left out: a Hub id, a name)."""
    resolved = Path(os.path.realpath(os.path.expanduser(os.fspath(target))))
    for source in sources:
        if source is None or not os.path.exists(os.path.expanduser(os.fspath(source))):
            continue
        read = Path(os.path.realpath(os.path.expanduser(os.fspath(source))))
        how = ("is" if read == resolved else "contains" if resolved in read.parents
               else "lies inside" if read in resolved.parents else None)
        if how:
            raise TargetIsSource(f"{what} {target} {how} {source}, which this command reads: writing there would "
                                 "replace or mix with what it reads. Give a folder apart from it.")
    return resolved


def not_empty(folder: Path, overwrite_hint: str) -> str | None:
    """Why `folder` cannot be written whole without being told to replace it (None: it can)."""
    if folder.exists() and not folder.is_dir():
        return f"{folder} is a file, not a folder: give a new folder to write to."
    entries = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
    if entries:
        shown = ", ".join(entries[:4]) + (", ..." if len(entries) > 4 else "")
        return (f"{folder} is not empty ({len(entries)} entries: {shown}): writing there would leave its files beside "
                f"the new ones. Give a new or empty folder, or {overwrite_hint} to replace the whole folder.")
    return None


def writable_target(target, *, overwrite: bool = False, sources=(),
                    overwrite_hint: str = "pass overwrite=True") -> Path:
    """`target` resolved, once it is known that `staged_folder` may replace it: not a source
    (`check_target`), and empty or absent unless `overwrite`; else `TargetIsSource` or
    `FileExistsError`, which say why and what to do."""
    folder = check_target(target, sources)
    refused = not_empty(folder, overwrite_hint)
    if refused and (not overwrite or not folder.is_dir()):
        raise FileExistsError(refused)
    return folder


RENAME_EXCHANGE = 2  # linux/fs.h
AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux `renameat2(..., RENAME_EXCHANGE)`); False where that is not available."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        return False
    return renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0


@contextmanager
def staged_folder(target, *, overwrite: bool = False, sources=(), overwrite_hint: str = "pass overwrite=True"):
    """Write a folder whole: yields a new empty folder beside `target` (resolved, `check_target`
    against `sources`), which replaces `target` once the block ends without an error. A non-empty
    `target` is refused (`not_empty`) unless `overwrite`, when it is checked and again when the new
    folder is renamed in (`_move_in`): a `target` that another writer filled meanwhile is refused
    then, untouched. With `overwrite`, where the system can (Linux), the old and new folders are
    exchanged in one rename; elsewhere the old one is renamed aside first. `writable_target` says
    what is refused."""
    folder = writable_target(target, overwrite=overwrite, sources=sources, overwrite_hint=overwrite_hint)
    folder.parent.mkdir(parents=True, exist_ok=True)
    written = Path(tempfile.mkdtemp(prefix=f".{folder.name}.staging-", dir=folder.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(written, 0o777 & ~umask)  # as a folder made by makedirs (mkdtemp's is private)
    try:
        yield written
        if not overwrite or not folder.exists():
            _move_in(written, folder, overwrite_hint)
        elif _exchange(written, folder):  # `written` now holds the old folder, removed below
            pass
        else:
            old = Path(tempfile.mkdtemp(prefix=f".{folder.name}.old-", dir=folder.parent))
            os.replace(folder, old / folder.name)
            os.replace(written, folder)
            shutil.rmtree(old)
    finally:
        shutil.rmtree(written, ignore_errors=True)


def _move_in(written: Path, folder: Path, overwrite_hint: str) -> None:
    """Rename `written` to `folder`, which must be absent or an empty folder: in one step where the
    system renames onto an empty folder and refuses a non-empty one (POSIX), so that a `folder` that
    another writer filled since it was checked is refused (`not_empty`, a FileExistsError) and left
    as it is; where the system renames onto no existing folder (Windows), the empty one is removed
    first."""
    try:
        os.rename(written, folder)
    except OSError as error:
        refused = not_empty(folder, overwrite_hint)
        if refused:
            raise FileExistsError(refused) from None
        if not isinstance(error, FileExistsError):
            raise
        try:
            os.rmdir(folder)  # empty: a rename cannot replace it here
            os.rename(written, folder)
        except OSError:  # filled in between
            raise FileExistsError(not_empty(folder, overwrite_hint) or str(error)) from None


# weight files of a save_pretrained folder (safetensors or torch, sharded or not, with their index)
WEIGHT_FILE = re.compile(r"(model|pytorch_model)(-\d{5}-of-\d{5})?\.(safetensors|bin)(\.index\.json)?")


SAVING_PREFIX = ".saving-"  # the folder `save_then_swap` writes into, inside the target


def save_then_swap(save, save_directory, replaced=frozenset()) -> None:
    """Run `save(folder)` (a `save_pretrained`) into a fresh folder inside `save_directory`, then
    move what it wrote into `save_directory`, `config.json` last (an earlier save's is removed before
    the first file moves: the folder never pairs it with this save's files), and remove the weight
    files and the `replaced` names (the code files a save of this model may write) of an earlier save
    that this one did not write. A save that fails (a full disk) leaves the earlier save as it was:
    transformers writes `config.json` first and the weights in place."""
    save_directory = os.fspath(save_directory)
    os.makedirs(save_directory, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=SAVING_PREFIX, dir=save_directory)
    try:
        save(staging)
        written = sorted(os.listdir(staging), key=lambda name: name == "config.json")
        if "config.json" in written and os.path.isfile(os.path.join(save_directory, "config.json")):
            os.remove(os.path.join(save_directory, "config.json"))
        for name in written[:-1] if written and written[-1] == "config.json" else written:
            os.replace(os.path.join(staging, name), os.path.join(save_directory, name))
        for name in os.listdir(save_directory):
            if (WEIGHT_FILE.fullmatch(name) or name in replaced) and name not in written:
                os.remove(os.path.join(save_directory, name))
        if "config.json" in written:
            os.replace(os.path.join(staging, "config.json"), os.path.join(save_directory, "config.json"))
    finally:
        shutil.rmtree(staging, ignore_errors=True)


ENTRY_FILES = ("configuration_outheads.py", "modeling_outheads.py")  # what a saved config.json's auto_map names
CATALOG = "head_catalog.py"
IMPORT_LINE = re.compile(r"from \.(\w+) import (\w+)\n")


def package_code_files(model_class: type) -> set[str]:
    """The code files a save of `model_class` may have written (transformers' remote code copies the
    files its module imports, relatively, recursively): the modules of the package it comes from (the
    installed one's, or a saved folder's), and the names of the installed package's tools, which a
    save by an older version of the package copied beside them."""
    package = Path(sys.modules[model_class.__module__].__file__).parent
    return {path.name for pattern in ("*.py", "tools/*.py") for path in package.glob(pattern)} - {"__init__.py"}


def runtime_code_only(folder, model_class: type, head_classes) -> None:
    """Cut the code files transformers copied into a saved `folder` to what loading, `forward` and
    `generate` of the model need: `head_catalog.py` keeps the lines of `head_classes` alone (the
    model's heads: `mtp` and its shared head), then every copied file that the config and model
    files do not import (relatively, recursively) is removed. No head name is known here; a file that
    is not one of the package's modules is left alone."""
    folder = Path(folder)
    if not (folder / CATALOG).is_file():  # no code saved (not remote code)
        return
    wanted = {(cls.__module__.rsplit(".", 1)[-1], cls.__name__) for cls in head_classes}
    lines = (folder / CATALOG).read_text(encoding="utf-8").splitlines(keepends=True)
    heads = {line: match.groups() for line in lines
             if (match := IMPORT_LINE.fullmatch(line)) and match[1] != "head_interface"}
    for module, name in sorted(wanted - set(heads.values())):
        logger.warning("The head class %s (module %s) is not one of %s's: the saved folder's remote code cannot build "
                       "it. Load the model with hf_outheads installed and that module imported.", name, module, CATALOG)
    kept = [line for line in lines if line not in heads or heads[line] in wanted]
    (folder / CATALOG).write_text("".join(kept), encoding="utf-8")
    from transformers.dynamic_module_utils import get_relative_import_files  # (here: the commands import this module)

    needed = set(ENTRY_FILES)
    for entry in ENTRY_FILES:
        if (folder / entry).is_file():
            needed.update(os.path.basename(path) for path in get_relative_import_files(folder / entry))
    for name in package_code_files(model_class) - needed:
        (folder / name).unlink(missing_ok=True)
