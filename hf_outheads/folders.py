"""The one rule for a command that writes a folder: the target is never a source. A target that
is, contains or lies inside a folder or file the command reads (`check_target`: resolved paths,
symlinks followed) is refused before anything is written. A folder written whole (`staged_folder`)
is written beside the target and then swapped in, so the target holds either its old content or
the complete new one, and nothing but the target and the staging folders beside it is touched.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path


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
    `target` is refused (`not_empty`) unless `overwrite`. Where the system can (Linux), the old and
    new folders are exchanged in one rename; elsewhere the old one is renamed aside first.
    `writable_target` says what is refused."""
    folder = writable_target(target, overwrite=overwrite, sources=sources, overwrite_hint=overwrite_hint)
    folder.parent.mkdir(parents=True, exist_ok=True)
    written = Path(tempfile.mkdtemp(prefix=f".{folder.name}.staging-", dir=folder.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(written, 0o777 & ~umask)  # as a folder made by makedirs (mkdtemp's is private)
    try:
        yield written
        if not folder.exists():
            os.replace(written, folder)
        elif _exchange(written, folder):  # `written` now holds the old folder, removed below
            pass
        else:
            old = Path(tempfile.mkdtemp(prefix=f".{folder.name}.old-", dir=folder.parent))
            os.replace(folder, old / folder.name)
            os.replace(written, folder)
            shutil.rmtree(old)
    finally:
        shutil.rmtree(written, ignore_errors=True)
