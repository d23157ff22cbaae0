"""What keeps a run's work: one run per output_dir (`RunLock`), no earlier model replaced unless
asked (`earlier_work`), a stop at the first non-finite loss or gradient norm (`check_finite`), and a
full disk named as such (`disk_full_error`)."""

from __future__ import annotations

import atexit
import errno
import json
import math
import os
import shutil
import socket
import time
from pathlib import Path

LOCK_FILE = ".train.lock"
STARTING_S = 10.0  # an unreadable lock younger than this is a run writing it, not a killed one's


class OutputDirInUse(ValueError):
    """Another run holds the output_dir's lock."""


class EarlierWork(ValueError):
    """The output_dir holds what the run would replace (`earlier_work`) and it was not told to overwrite."""


def earlier_work(output_dir) -> str | None:
    """What a run would replace in `output_dir`, said in words, or None. transformers' Trainer
    convention: a run writes into a new or empty folder, or one of its own runs, unless told to
    overwrite. Refused: a finished model (`config.json`, moved in last by a finished run,
    `publish.finish_run`: its weights, card, metrics and checkpoints would be replaced), and files of no run (neither
    `metrics.jsonl`, which a run creates before any other file, `tracking.start_log`, nor `checkpoints/`). An
    unfinished run's folder is not: it is resumed (or, with `resume: never`, started afresh)."""
    folder = Path(output_dir)
    if (folder / "config.json").is_file():
        return (f"{folder} holds the finished model of an earlier run: this run would replace its weights, card, "
                "metrics and checkpoints")
    entries = sorted(p.name for p in folder.iterdir() if p.name != LOCK_FILE) if folder.is_dir() else []
    if entries and not {"metrics.jsonl", "checkpoints"} & set(entries):
        shown = ", ".join(entries[:4]) + (", ..." if len(entries) > 4 else "")
        return f"{folder} is not empty ({shown}) and holds no run: this run would write over what is there"
    return None


class NonFiniteError(ValueError):
    """A loss or gradient norm that is NaN or infinite; `train_loop` adds the step and the last good checkpoint."""


def check_finite(what: str, value) -> None:
    """Raise `NonFiniteError` when `value` (a float or a 0-d tensor) is NaN or infinite (None:
    not known, e.g. a gradient norm DeepSpeed does not return)."""
    if value is None:
        return
    number = float(value)
    if not math.isfinite(number):
        raise NonFiniteError(f"the {what} is {number}")


def _process_start(pid: int) -> float | None:
    """The start time of process `pid` (None when there is no such process)."""
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


class RunLock:
    """`output_dir/.train.lock`: the pid, host and start time of the run writing the folder.
    A second run on the folder is refused, naming the first; a lock whose process has ended
    (killed run) is stale and taken over; a lock file this class did not write is refused, naming
    it. `made`: the outermost folder the run made for output_dir (None: it existed); `release`
    removes the folders it made that the run left empty."""

    def __init__(self, output_dir):
        self.path = Path(output_dir) / LOCK_FILE
        self.held = False
        self.made: Path | None = None

    def _read(self) -> dict | None:
        try:
            owner = json.loads(self.path.read_text())
        except (OSError, ValueError):  # gone, being written, or left empty by a run killed while writing it
            return None
        if not (isinstance(owner, dict) and isinstance(owner.get("pid"), int) and isinstance(owner.get("host"), str)
                and isinstance(owner.get("process_start"), (int, float, type(None)))):
            raise OutputDirInUse(
                f"The lock file {self.path} holds {json.dumps(owner)[:80]}, not the pid and host of a run: it was not "
                f"written by this script, so whether a run is writing {self.path.parent} cannot be told. If none is, "
                f"delete {self.path}.")
        return owner

    def _is_stale(self, owner: dict | None) -> bool:
        if not owner:  # unreadable: being written by a run starting now, or left empty by one killed while writing it
            try:
                return time.time() - self.path.stat().st_mtime > STARTING_S
            except FileNotFoundError:
                return True
        if owner.get("pid") == os.getpid() and owner.get("host") == socket.gethostname():
            return True  # an earlier run in this same process (ended by an error)
        if owner.get("host") != socket.gethostname():
            return False  # cannot tell: another machine's run
        started = _process_start(owner["pid"])
        return started is None or abs(started - (owner.get("process_start") or started)) > 1.0  # pid reused

    def acquire(self) -> str | None:
        """Take the lock; returns a note when a stale lock was taken over, raises ValueError
        when another run holds it."""
        note = None
        me = {"pid": os.getpid(), "host": socket.gethostname(), "process_start": _process_start(os.getpid()),
              "started": time.strftime("%Y-%m-%d %H:%M:%S %z")}
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                owner = self._read()
                if not self._is_stale(owner):
                    who = (f"pid {owner.get('pid')} on {owner.get('host')}, started {owner.get('started')}" if owner
                           else "a run starting now, writing its lock")
                    raise OutputDirInUse(
                        f"Another run is writing {self.path.parent}: {who} (lock file {self.path}). Two runs on one "
                        "output_dir would mix their checkpoints and weights: wait for it to finish, stop it, or use "
                        "another --output_dir. "
                        f"If that run is gone, delete {self.path}.") from None
                if owner and owner.get("pid") != os.getpid():
                    note = f"Took over the stale lock {self.path} of an ended run (pid {owner.get('pid')})."
                self.path.unlink(missing_ok=True)
                continue
            with os.fdopen(fd, "w") as file:
                json.dump(me, file)
            self.held = True
            _HELD.append(self)
            atexit.register(self.release)
            return note
        raise ValueError(f"Could not take the lock {self.path}: other runs keep taking it; use another --output_dir.")

    def release(self) -> None:
        """Remove the lock file if this process holds it (also run at exit), and the folder if the
        run made it and left nothing in it."""
        if self.held:
            self.held = False
            try:
                owner = self._read()
            except OutputDirInUse:  # overwritten by hand while the run held it: not this run's to remove
                return
            if owner and owner.get("pid") == os.getpid():
                self.path.unlink(missing_ok=True)
            folders = [self.path.parent, *self.path.parent.parents]
            for folder in folders[: folders.index(self.made) + 1] if self.made in folders else []:
                try:
                    folder.rmdir()
                except OSError:  # not empty: the run wrote there
                    break


_HELD: list[RunLock] = []


def release_run_locks() -> None:
    """Release every lock this process holds (before `os._exit`, which runs no exit handlers)."""
    while _HELD:
        _HELD.pop().release()


def disk_full_error(path, error: BaseException) -> BaseException | None:
    """An OSError saying that the disk holding `path` is full, for an `error` raised while
    writing there when the disk is full (ENOSPC, or torch's `unexpected pos ... iostream error`,
    which names no cause, with under 1 MiB left); None for any other error."""
    folder = Path(path)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        free = None
    no_space = getattr(error, "errno", None) == errno.ENOSPC or (free is not None and free < 2**20)
    if not no_space:
        return None
    return OSError(errno.ENOSPC, f"The disk is full: writing {path} failed ({str(error).splitlines()[0][:200]}); "
                                 f"{free if free is not None else '?'} bytes are free on the filesystem of {folder}. "
                                 "Free space there (or point --output_dir at a larger disk) and run the same command "
                                 "again: it resumes from the last complete checkpoint.")
