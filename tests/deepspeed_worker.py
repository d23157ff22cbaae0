"""Run by tests/test_deepspeed.py under torchrun: 2 CPU processes (DeepSpeed's CPU accelerator,
`DS_ACCELERATOR=cpu`, gloo). Every head (tests/sharded_cases.py) is prepared by accelerate's
`Accelerator` with a `DeepSpeedPlugin`, as `accelerate launch --config_file
training/accelerate_zero3.yaml` builds it, trained a few SGD steps, each process on its half of
every batch, and compared with the same model trained unsharded on both halves:
  - "zero3": ZeRO stage 3 (every parameter partitioned: persistence thresholds 0), the model
    built before the Accelerator (`zero3_init_flag: false`, the shipped config);
  - "zero3_init": ZeRO-3 with `zero3_init_flag: true`: the model loaded with `from_pretrained`
    under `deepspeed.zero.Init` (partitioned as it is built) from the reference's start weights;
  - "zero2": ZeRO stage 2;
  - "zero3_accumulation": gradient accumulation (DeepSpeed's own, through
    `accelerator.accumulate`): two micro-batches per step equal one batch twice as large;
  - "trainer_zero3": transformers' `Trainer` with `TrainingArguments(deepspeed=...)` (ZeRO-3),
    SGD at a constant rate, batches in order: the same steps (`trainer_run`).
ZeRO-3 runs gather the full weights with `accelerator.get_state_dict` (`zero3_save_16bit_model`),
which rank 0 saves with `save_pretrained` and, once DeepSpeed is done, loads back with
`from_pretrained`. Rank 0 writes what it measured as JSON to argv[1]; the test judges it."""

from __future__ import annotations

import json
import sys
import tempfile

import torch
import torch.distributed as dist
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from accelerate.utils import DeepSpeedPlugin, InitProcessGroupKwargs
from transformers.integrations import unset_hf_deepspeed_config

from hf_outheads import OutHeadsForCausalLM
from sharded_cases import CASES, LR, ROWS, batches, case_model, dropout_off, max_diff, mean_over_processes, reference_run

ENGINES = ("zero3", "zero3_init", "zero2", "zero3_accumulation", "trainer_zero3")


def accelerator_for(stage: int, zero3_init: bool, accumulation: int) -> Accelerator:
    AcceleratorState._reset_state(reset_partial_state=True)  # a fresh plugin per engine
    config = {"train_micro_batch_size_per_gpu": ROWS // accumulation, "gradient_accumulation_steps": accumulation,
              "gradient_clipping": 0.0, "zero_allow_untested_optimizer": True,
              "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0,
                                    "stage3_model_persistence_threshold": 0,
                                    "stage3_gather_16bit_weights_on_model_save": True,
                                    # ZeRO-1/2 on DeepSpeed's CPU accelerator: its contiguous gradient buffer is never allocated
                                    **({"contiguous_gradients": False} if stage < 3 else {})}}
    plugin = DeepSpeedPlugin(hf_ds_config=config, zero3_init_flag=zero3_init)
    # DeepSpeed on a CPU: accelerate's process group needs its backend named (gloo)
    return Accelerator(deepspeed_plugin=plugin, gradient_accumulation_steps=accumulation,
                       kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")])


def train(accelerator, model, accumulation: int):
    """The reference's SGD steps, sharded: each process takes its half of every batch, in
    `accumulation` micro-batches (`accelerator.accumulate`: DeepSpeed steps after the last).
    Returns (losses averaged over processes and micro-batches, the prepared model)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    model, optimizer = accelerator.prepare(model, optimizer)
    losses = []
    for ids in batches():
        half, total = ids.split(ROWS)[accelerator.process_index], 0.0
        for micro in half.split(ROWS // accumulation):
            with accelerator.accumulate(model):
                loss = model(input_ids=micro, labels=micro).loss
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            total += loss.detach() / accumulation
        losses.append(mean_over_processes(total))
    return losses, model


def run_engine(engine: str, folder: str, references: dict) -> dict:
    """Every head under one engine; an Accelerator per model (accelerate drives one DeepSpeed
    engine per plugin: a second model prepared by the same Accelerator trains wrongly)."""
    stage, accumulation = (2 if engine == "zero2" else 3), (2 if engine == "zero3_accumulation" else 1)
    results = {}
    for name in (["mos", "tied"] if accumulation > 1 else CASES):
        unset_hf_deepspeed_config()  # the previous Accelerator's: a model built here is plain, as the reference
        model = None if engine == "zero3_init" else case_model(name).train()
        accelerator = accelerator_for(stage, engine == "zero3_init", accumulation)
        if model is None:  # built partitioned under deepspeed.zero.Init by from_pretrained
            model = dropout_off(OutHeadsForCausalLM.from_pretrained(f"{folder}/start/{name}")).train()
        partitioned = model.get_input_embeddings().weight.numel() == 0
        losses, model = train(accelerator, model, accumulation)
        state = accelerator.get_state_dict(model)  # ZeRO-3: gathered from the partitions, for the main process
        result = {"losses": losses, "expected_losses": references[name]["losses"], "partitioned_at_build": partitioned,
                  "processes": accelerator.num_processes, "distributed_type": str(accelerator.distributed_type),
                  "gradient_accumulation_steps": accelerator.gradient_accumulation_steps}
        if accelerator.is_main_process:
            result["weight_diff"] = max_diff(state, references[name]["state"])
            if stage == 3:
                result["saved"] = f"{folder}/{engine}/{name}"
                accelerator.unwrap_model(model).save_pretrained(result["saved"], state_dict=state)
        results[name] = result
        accelerator.wait_for_everyone()
    return results


def trainer_run(folder: str, references: dict) -> dict:
    """Every head trained by `Trainer` under ZeRO-3 (`TrainingArguments(deepspeed=config)`).
    On a CPU, `TrainingArguments` would set up its process state without a backend (accelerate
    then counts one process per run); it uses the state configured here instead
    (`use_configured_state`: accelerate's state with a gloo group, DeepSpeed selected)."""
    from torch.utils.data import SequentialSampler
    from transformers import Trainer, TrainingArguments

    class InOrder(Trainer):  # the reference's batches: in order, each process its half of each
        def _get_train_sampler(self, dataset=None):
            return SequentialSampler(dataset if dataset is not None else self.train_dataset)

    rows = [{"input_ids": row, "labels": row} for ids in batches() for row in ids]
    config = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
              "gradient_clipping": "auto", "zero_allow_untested_optimizer": True,
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                    "stage3_model_persistence_threshold": 0,
                                    "stage3_gather_16bit_weights_on_model_save": True}}
    results = {}
    for name in CASES:
        unset_hf_deepspeed_config()
        model = case_model(name).train()
        AcceleratorState._reset_state(reset_partial_state=True)
        Accelerator(kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")])  # the configured state
        AcceleratorState._reset_state(reset_partial_state=False)  # Trainer builds its own Accelerator on it
        args = TrainingArguments(f"{folder}/trainer/{name}", deepspeed=config, per_device_train_batch_size=ROWS,
                                 learning_rate=LR, optim="sgd", lr_scheduler_type="constant", max_grad_norm=0.0,
                                 weight_decay=0.0, num_train_epochs=1, logging_steps=1, report_to="none",
                                 save_strategy="no", seed=0, data_seed=0, dataloader_num_workers=0,
                                 accelerator_config={"use_configured_state": True})
        trainer = InOrder(model=model, args=args, train_dataset=rows)
        trainer.train()
        losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
        result = {"losses": losses, "expected_losses": references[name]["losses"],
                  "processes": trainer.accelerator.num_processes,
                  "distributed_type": str(trainer.accelerator.distributed_type),
                  "steps": trainer.state.global_step, "gradient_accumulation_steps": args.gradient_accumulation_steps,
                  "partitioned_at_build": False}
        trainer.save_model(f"{folder}/trainer_saved/{name}")  # ZeRO-3: gathered 16-bit (here fp32) weights
        if trainer.accelerator.is_main_process:
            result["saved"] = f"{folder}/trainer_saved/{name}"
        results[name] = result
        trainer.accelerator.wait_for_everyone()
    return results


def main(out_path: str) -> None:
    torch.set_num_threads(1)
    references = {}
    with tempfile.TemporaryDirectory() as folder:  # one per process
        for name in CASES:  # unsharded references, before any DeepSpeed config is active
            start = case_model(name)
            start.save_pretrained(f"{folder}/start/{name}")  # zero3_init loads these start weights
            references[name] = reference_run(start.train())
        engines = sys.argv[2].split(",") if len(sys.argv) > 2 else ENGINES
        results = {engine: trainer_run(folder, references) if engine == "trainer_zero3"
                   else run_engine(engine, folder, references) for engine in engines}
        unset_hf_deepspeed_config()
        if dist.get_rank() == 0:  # the saved full weights load with from_pretrained, outside DeepSpeed
            for engine in results.values():
                for name, result in engine.items():
                    if "saved" in result:
                        loaded = OutHeadsForCausalLM.from_pretrained(result.pop("saved")).train()
                        result["loaded_diff"] = max_diff(loaded.state_dict(), references[name]["state"])
                        result.setdefault("weight_diff", result["loaded_diff"])  # Trainer: its saved weights
                        result["architectures"] = loaded.config.architectures
            with open(out_path, "w") as f:
                json.dump(results, f, indent=1)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
