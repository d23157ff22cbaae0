"""Checkpoints a run can always resume from: written atomically, never unpickling code, and
refused when they belong to another model.

Layout: `output_dir/checkpoints/checkpoint_<step>/`, accelerate's `save_state` files (model
weights as safetensors; optimizer, schedule and RNG states as `torch.save` files, loaded with
`weights_only=True`) plus `checkpoint.json`, written last: the run's progress, the model's
identity and the options it was trained with, which a resumed run must give alike but for those
that may change (`resume_changes`). A checkpoint is saved into `checkpoints/tmp-checkpoint_<step>`, completed by
`checkpoint.json`, then renamed (`os.replace`); only then are the oldest complete checkpoints
beyond `save_total_limit` (an integer >= 1, or None: all kept) deleted, never the one just saved.
A folder without `checkpoint.json` (a save killed half-way, a stale `tmp-*`) is never resumed
from and never counts towards the limit. A save that fails is removed; on a full disk the error
says so and where (`safeguards.disk_full_error`).
Rotation is ours, not `ProjectConfiguration(automatic_checkpoint_naming=True, total_limit=...)`:
accelerate saves in place and deletes by folder count, so a killed save would be resumed from.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
from pathlib import Path

from hf_outheads.training.options import RESUME_MAY_CHANGE, RUN_LENGTH, reassign_interval, saved_options
from hf_outheads.training.safeguards import disk_full_error

MARKER = "checkpoint.json"
FORMAT = 1


def checkpoint_number(path: Path) -> int:
    match = re.fullmatch(r"checkpoint_(\d+)", Path(path).name)
    return int(match.group(1)) if match else -1


def is_complete(path: Path) -> bool:
    return checkpoint_number(path) >= 0 and (Path(path) / MARKER).is_file()


def complete_checkpoints(output_dir) -> list[Path]:
    """Complete checkpoints, oldest first."""
    folder = Path(output_dir) / "checkpoints"
    return sorted((p for p in folder.glob("checkpoint_*") if is_complete(p)), key=checkpoint_number)


def checkpoint_to_resume(output_dir, resume: str) -> Path | None:
    """The latest complete checkpoint for resume='auto', a given one, or None ('never')."""
    if resume == "never":
        return None
    if resume != "auto":
        if not (Path(resume) / MARKER).is_file():
            raise ValueError(f"resume={resume!r} is not a complete checkpoint folder (no {MARKER}); "
                             "give a checkpoints/checkpoint_<step> folder, 'auto' or 'never'.")
        return Path(resume)
    found = complete_checkpoints(output_dir)
    return found[-1] if found else None


def model_identity(model) -> dict:
    """What must match for a checkpoint to load into `model`: head, its options, backbone."""
    config = model.config
    text = config.text_config
    return {"head_type": config.head_type, "head_options": config.head_options, "backbone": text.model_type,
            "vocab_size": config.vocab_size, "parameters": {n: list(p.shape) for n, p in model.state_dict().items()}}


def check_identity(path: Path, saved: dict, model) -> None:
    """Refuse a checkpoint written for another model, naming both and how to start fresh."""
    current = model_identity(model)
    different = [key for key in current if saved.get(key) != current[key]]
    if not different:
        return
    describe = lambda i: f"head '{i.get('head_type')}' on a {i.get('backbone')} backbone (vocabulary {i.get('vocab_size')})"
    raise ValueError(
        f"The checkpoint {path} belongs to another model: it was written for {describe(saved)}, this run builds "
        f"{describe(current)} (differing: {', '.join(different)}). Start fresh with --resume never (the old "
        "checkpoints are then replaced), or use another --output_dir."
    )


def resume_changes(path: Path, options, head_class: type | None) -> dict:
    """{option: [trained with, given]} for the run's length (`options.RUN_LENGTH`) where `options` (resolved:
    `launching.with_launch_precision`) give another than the checkpoint `path` was trained with; a ValueError
    naming every other option given otherwise, with both values and what to do, but for those that may change on
    resume (`options.RESUME_MAY_CHANGE`). For a head that updates itself periodically the interval is compared as
    it applies (`options.reassign_interval`: eval_steps sets it when code_reassign_steps is null); for any other
    head code_reassign_steps is not compared. `head_class` is the class of the model the checkpoint was loaded
    into (which `load_checkpoint` checked is the checkpoint's) or, before the model is built, the run's head's
    (`preflight`); None (a pretrained head kept, not known before the model is built): the interval is left to
    the check with the model. A checkpoint saved without its options: {}."""
    record = json.loads((Path(path) / MARKER).read_text())
    trained = record.get("options")
    if trained is None:
        return {}
    given = json.loads(json.dumps(saved_options(options)))  # as checkpoint.json holds them
    follows_eval = None in (trained.get("code_reassign_steps"), given.get("code_reassign_steps"))
    periodic = head_class is not None and head_class.updates_periodically
    for values in (trained, given):  # the interval as it applies; for another head it changes nothing
        interval = reassign_interval(values.pop("code_reassign_steps", None), values.get("eval_steps"))
        if periodic:
            values["code_reassign_steps"] = interval
    changed = {name: [trained[name], value] for name, value in given.items()
               if name in trained and trained[name] != value}
    refused = {name: values for name, values in changed.items() if name not in RESUME_MAY_CHANGE}
    if refused:
        listed = ", ".join(f"{name} (trained with {json.dumps(old)}, given {json.dumps(new)})"
                           for name, (old, new) in refused.items())
        if "code_reassign_steps" in refused and follows_eval:
            listed += (" (code_reassign_steps null is eval_steps: to evaluate at other steps, give "
                       f"code_reassign_steps {json.dumps(refused['code_reassign_steps'][0])})")
        raise ValueError(f"Resuming {path} with options other than it was trained with: {listed}; the run would "
                         "have trained with both while its record states one. Give the checkpoint's values to resume "
                         "it, or train anew with another --output_dir (or --resume never, which replaces its "
                         "checkpoints).")
    return {name: values for name, values in changed.items() if name in RUN_LENGTH}


def _write_json(path: Path, value: dict) -> None:
    part = path.with_suffix(".part")
    part.write_text(json.dumps(value, indent=1))
    os.replace(part, path)


def save_checkpoint(accelerator, model, output_dir, progress: dict, total_limit: int | None,
                    options=None) -> Path:
    """Save the accelerate state, `progress` and the run's `options` (resolved: `launching.with_launch_precision`)
    atomically as `checkpoints/checkpoint_<step>`."""
    folder = Path(output_dir) / "checkpoints"
    final = folder / f"checkpoint_{progress['step']}"
    tmp = folder / f"tmp-{final.name}"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)  # left by a killed save
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    try:
        accelerator.save_state(str(tmp), safe_serialization=True)
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            identity = model_identity(accelerator.unwrap_model(model))
            _write_json(tmp / MARKER, {"format": FORMAT, "progress": progress, "model": identity,
                                       **({"options": saved_options(options)} if options is not None else {})})
    except (OSError, RuntimeError) as error:  # torch.save reports a full disk as a RuntimeError
        shutil.rmtree(tmp, ignore_errors=True)  # the partial save: never resumed from, and it frees the space
        full = disk_full_error(tmp, error)
        if full is None:
            raise
        raise full from error
    if accelerator.is_main_process:
        if final.exists():  # the same step saved again: keep it until the new one is in place
            old = folder / f"tmp-old-{final.name}"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old)
        else:
            os.replace(tmp, final)
        others = [path for path in complete_checkpoints(output_dir) if path != final]
        for stale in others[: max(len(others) + 1 - total_limit, 0)] if total_limit else []:  # the oldest
            shutil.rmtree(stale)
    accelerator.wait_for_everyone()
    return final


def load_checkpoint(accelerator, model, path: Path) -> dict:
    """Check `path` belongs to `model`, load the accelerate state without unpickling code, and
    return the saved progress."""
    saved = json.loads((Path(path) / MARKER).read_text())
    check_identity(path, saved.get("model", {}), accelerator.unwrap_model(model))
    planted = sorted(p.name for p in Path(path).glob("custom_checkpoint_*.pkl"))
    if planted:
        raise ValueError(f"The checkpoint {path} holds {planted}: pickled objects this script never writes and "
                         "will not load (unpickling runs code). Delete them, or start fresh with --resume never.")
    try:
        accelerator.load_state(str(path), load_kwargs={"weights_only": True})
    except pickle.UnpicklingError as error:
        raise ValueError(f"The checkpoint {path} holds a state file that is not plain tensors and numbers; it was "
                         f"refused, not unpickled ({str(error).splitlines()[0]}). Start fresh with --resume never, "
                         "or use another --output_dir.") from None
    return saved["progress"]
