"""LoRA adapters (peft) under ZeRO, on the course's tiny GPT-2, in one launch.

Per-rank bytes of parameters, gradients and optimizer states at ZeRO stages 0, 2 and 3 for full fine-tuning and for LoRA, with the collectives of one step (comms logger); the activations of a
forward and backward pass; a base model saved with save_pretrained, loaded under ZeRO-3 through
HfDeepSpeedConfig, given an adapter with get_peft_model and trained with a raw deepspeed.initialize loop; what
each rank's state dict holds of the adapter, the adapter saved without and with a gather; the same adapter
trained at ZeRO-2. With a DeepSpeed config (it says
"auto" where the Trainer fills values in), the HF Trainer then trains the same adapter at ZeRO-3 from the same
checkpoint, with the model as loaded and with its loss type named, and saves it (save_model).
With --adapter_state FILE --base FOLDER, only: the checkpoint in FOLDER loaded under ZeRO-3, its adapter trained a few
steps, then saved with DeepSpeed's own gather and with your adapter_state(model) from FILE (exercise 2).

Run from a terminal:
  deepspeed --num_gpus 2 scripts/12_adapters.py --deepspeed_config configs/12_adapters_trainer.json
"""
import argparse
import gc
import os
import resource
import warnings

import deepspeed
import peft  # noqa: F401  (imported before gc.freeze() below)
import torch
import torch.distributed as dist
from transformers import GPT2LMHeadModel
from transformers.integrations.deepspeed import unset_hf_deepspeed_config

from course_utils.rank import comms
from course_utils.common.records.adapters import (Activations, AdapterMemory, AdapterState, Losses, OneDevice, Saved,
                                                  TokenCount)
from course_utils.rank.adapters import (LORA_R, LORA_TARGETS, PRESET, SampleDataset, adapter_view,
    micro_batch, save_adapter, save_base, saved_activation_bytes, shared_folder, trainable_numel, with_lora, zero3_view)
from course_utils.rank.data import fixed_batch
from course_utils.rank.engine import ds_config, release
from course_utils.rank.memory import model_state_bytes, tensor_inventory
from course_utils.rank.models import preset, tiny_gpt2
from course_utils.common.record import record
from course_utils.common.zero_rules import edge_grad_numel
from course_utils.rank.scaffolding import finish, load_exercise, parse_args, rank0_print, scratch_dir

MICRO = 4                 # sequences per rank and step
LEARNING_RATE = 1e-3      # the course configs' AdamW (configs/zero*.json): lr 1e-3, weight decay 0.01, clipping 1.0


def zero_config(stage: int, persistence: int | None = None) -> dict:
    """The course config of ``stage`` in fp32; stage 3 keeps parameters of at most 10 × hidden size elements whole,
    the value the Trainer's "auto" gives ``stage3_param_persistence_threshold`` (``persistence`` instead, if given)."""
    threshold = 10 * preset(PRESET).n_embd if persistence is None else persistence
    extra = {"stage3_param_persistence_threshold": threshold} if stage == 3 else {}
    return ds_config(stage, "fp32", micro_batch=MICRO, **extra)


def trainable(model) -> list:
    return [p for p in model.parameters() if p.requires_grad]


def train_step(engine, step: int) -> float:
    """Forward, backward and step on this rank's share of step ``step``; the loss averaged over the ranks."""
    ids = micro_batch(step, dist.get_rank(), dist.get_world_size(), MICRO).to(engine.device)
    loss = engine(input_ids=ids, labels=ids).loss
    engine.backward(loss)
    engine.step()
    mean = loss.detach().clone()
    dist.all_reduce(mean)
    return mean.item() / dist.get_world_size()


def measure(stage: int, kind: str, r: int, targets: list) -> None:
    """Build, take one step (Adam creates its states), then walk the engine's tensors after the next backward."""
    model = tiny_gpt2(PRESET)
    if kind != "full":
        model = with_lora(model, r, targets)
    n_trainable, total = trainable_numel(model)
    config = comms.with_comms_logger(zero_config(stage))
    # what the formula needs, from the model's sizes alone (not from DeepSpeed's own bookkeeping): stage 3 keeps
    # parameters of at most the persistence threshold whole; stage 2 holds whole the gradients touching its partition
    threshold = config["zero_optimization"].get("stage3_param_persistence_threshold", 0)
    persistent = sum(p.numel() for p in model.parameters() if stage == 3 and p.numel() <= threshold)
    grad_partition = edge_grad_numel([p.numel() for p in trainable(model)], dist.get_world_size(), dist.get_rank())
    peft_trainable = model.get_nb_trainable_parameters()[0] if kind != "full" else n_trainable
    engine, *_ = deepspeed.initialize(model=model, model_parameters=trainable(model), config=config)
    train_step(engine, 0)
    with comms.logged() as window:                       # every collective of one whole step
        ids = micro_batch(1, dist.get_rank(), dist.get_world_size(), MICRO).to(engine.device)
        engine.backward(engine(input_ids=ids, labels=ids).loss)
        measured = model_state_bytes(tensor_inventory(engine))
        engine.step()
    record(AdapterMemory(stage=stage, kind=kind, r=r if kind != "full" else 0, targets=list(targets) if kind != "full" else [],
                         rank=dist.get_rank(), world_size=dist.get_world_size(), total=total, trainable=n_trainable,
                         peft_trainable=peft_trainable, measured=measured, persistent_numel=persistent,
                         grad_partition_numel=grad_partition, messages=window.messages))
    if kind != "exercise":                               # exercise 1's figure: the notebook shows it after its check
        rank0_print(f"stage {stage} {kind:8s} trainable {n_trainable:>7,} of {total:,}: "
                    + "  ".join(f"{k}={v / 2**10:7.1f} KiB" for k, v in measured.items() if k != "buffers"))
    release(engine)


def activations() -> None:
    """Rank 0: what a forward and backward pass holds besides the weights, full fine-tuning vs LoRA."""
    if dist.get_rank() != 0:
        return
    for micro in (MICRO, 4 * MICRO):
        ids = micro_batch(0, 0, 1, micro)
        for kind in ("full", "lora"):
            model = tiny_gpt2(PRESET) if kind == "full" else with_lora(tiny_gpt2(PRESET))
            record(Activations(kind=kind, trainable=trainable_numel(model)[0], micro_batch=micro, tokens=ids.numel(),
                               saved_bytes=saved_activation_bytes(model, ids)))


def zero3_engine(base: str, steps: int, persistence: int | None = None):
    """from_pretrained under ZeRO-3 (an HfDeepSpeedConfig alive first), get_peft_model, deepspeed.initialize, each
    recorded; then ``steps`` raw training steps: (engine, the HfDeepSpeedConfig to keep alive). ``persistence``: the
    persistence threshold instead of the course's."""
    from transformers.integrations import HfDeepSpeedConfig

    config = zero_config(3, persistence)
    keep_alive = HfDeepSpeedConfig(config)            # from_pretrained now builds the model inside zero.Init
    model = GPT2LMHeadModel.from_pretrained(base)
    zero3_view(model, "from_pretrained")
    model = with_lora(model)
    zero3_view(model, "get_peft_model")
    engine, *_ = deepspeed.initialize(model=model, model_parameters=trainable(model), config=config)
    zero3_view(engine.module, "deepspeed.initialize")
    record(Losses(label="raw loop, ZeRO-3", losses=[train_step(engine, s) for s in range(steps)]))
    return engine, keep_alive


def save_gathered(engine) -> None:
    """The reference save: DeepSpeed's own consolidation, the Trainer's route (every rank gathers each module in turn,
    rank 0 keeps the trainable tensors), read by peft as a state dict it is handed."""
    from peft import get_peft_model_state_dict

    whole = engine._zero3_consolidated_16bit_state_dict(exclude_frozen_parameters=True)
    save_adapter("gathered", engine.module,
                 get_peft_model_state_dict(engine.module, state_dict=whole) if dist.get_rank() == 0 else None)


def yours_saved(path: str, base: str, steps: int) -> None:
    """Exercise 2's launch: the adapter trained under ZeRO-3 as in part 2, saved by DeepSpeed's gather and by your
    ``adapter_state(model)``, which every rank calls (rank 0's return value is written). Every parameter is
    partitioned here (persistence threshold 0): no adapter tensor, however small, comes back whole without a gather."""
    engine, keep_alive = zero3_engine(base, steps, persistence=0)
    save_gathered(engine)
    state = load_exercise(path, ["adapter_state"])["adapter_state"](engine.module)
    save_adapter("yours", engine.module, state if dist.get_rank() == 0 else None)
    release(engine)
    del keep_alive


def pitfall_and_fix(engine) -> None:
    """What each rank's adapter state dict holds without a gather; the adapter saved that way and gathered."""
    from peft import get_peft_model_state_dict

    model = engine.module
    with warnings.catch_warnings():                   # peft warns about what this record shows
        warnings.simplefilter("ignore")
        record(AdapterState(rank=dist.get_rank(), tensors=adapter_view(get_peft_model_state_dict(model), model)))
    save_adapter("without gather", model, None)
    save_gathered(engine)
    model.eval()
    with torch.no_grad():                             # every rank runs it: the forward gathers the weights
        logits = model(input_ids=fixed_batch().to(engine.device)).logits
    if dist.get_rank() == 0:
        record("trained_logits", logits.cpu())


def trainer_run(base: str, config_path: str, steps: int, loss_type: str | None):
    """The HF Trainer: TrainingArguments first (they hold an HfDeepSpeedConfig, so from_pretrained partitions),
    the same adapter and samples in the same order. ``loss_type``: what the Trainer is told the model's loss is
    (GPT-2's class name does not say; None leaves it as loaded)."""
    from accelerate.state import AcceleratorState
    from transformers import Trainer
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from course_utils.rank.trainer import training_arguments

    AcceleratorState._reset_state()                   # forget the previous run's DeepSpeed plugin
    targs = training_arguments(output_dir=scratch_dir(), deepspeed=config_path, per_device_train_batch_size=MICRO,
                               max_steps=steps, learning_rate=LEARNING_RATE, weight_decay=0.01, max_grad_norm=1.0,
                               lr_scheduler_type="constant", train_sampling_strategy="sequential", logging_steps=1,
                               save_strategy="no")
    model = GPT2LMHeadModel.from_pretrained(base)
    if loss_type:
        model.loss_type = loss_type
    trainer = Trainer(model=with_lora(model), args=targs,
                      train_dataset=SampleDataset(steps * MICRO * dist.get_world_size()))
    for printer in (PrinterCallback, ProgressCallback):     # the losses are read from log_history, not printed per step
        trainer.remove_callback(printer)
    trainer.train()
    label = "Trainer, ZeRO-3" + (f" (loss_type {loss_type})" if loss_type else " (GPT-2 as loaded)")
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    record(Losses(label=label, losses=losses))
    rank0_print(f"{label}: {len(losses)} steps, loss {losses[0]:.3f} → {losses[-1]:.3f}")
    if dist.get_rank() == 0:
        record(TokenCount(label=label, loss_type=str(getattr(model, "loss_type", None)),
                          shifts_labels=bool(trainer._loss_shifts_labels)))
    return trainer


def trainer_save(trainer) -> None:
    """save_model on every rank: under ZeRO-3 with a peft model the Trainer gathers the trainable parameters."""
    folder = shared_folder("adapters/Trainer save_model")
    trainer.save_model(str(folder))
    if dist.get_rank() == 0:
        record(Saved(label="Trainer save_model", folder=str(folder), warnings=[]))
    unset_hf_deepspeed_config()
    release(trainer.model_wrapped)


class StepClock:
    """A Trainer callback: the wall time of each optimizer step (the device synchronized at both ends)."""

    def __init__(self):
        from transformers import TrainerCallback

        clock = self

        class Callback(TrainerCallback):
            def on_step_begin(self, args, state, control, **kw):
                clock.start = synchronized()

            def on_step_end(self, args, state, control, **kw):
                clock.seconds.append(synchronized() - clock.start)
        self.seconds, self.start, self.callback = [], 0.0, Callback()


def synchronized() -> float:
    import time

    from deepspeed.accelerator import get_accelerator

    get_accelerator().synchronize()
    return time.perf_counter()


def one_device(configs: list, steps: int) -> None:
    """One rank: LoRA on the GPT-2 of this launch (the lesson's own, or the GPU size the notebook gave it) through
    the Trainer with each config and its offload, as a one-GPU user fine-tunes: in bf16 on a GPU (a CPU rank trains in
    fp32: the Trainer refuses bf16 without a GPU unless told ``use_cpu``, which would leave DeepSpeed out)."""
    from accelerate.state import AcceleratorState
    from deepspeed.accelerator import get_accelerator
    from transformers import Trainer
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from course_utils.common import zero_rules
    from course_utils.rank.models import SIZE_ENV
    from course_utils.rank.scaffolding import read_config
    from course_utils.rank.trainer import training_arguments

    device = get_accelerator().device_name()
    for path in configs:
        AcceleratorState._reset_state()
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        targs = training_arguments(output_dir=scratch_dir(), deepspeed=str(path), per_device_train_batch_size=MICRO,
                                   max_steps=steps, learning_rate=LEARNING_RATE, bf16=device == "cuda", logging_steps=1,
                                   save_strategy="no", train_sampling_strategy="sequential")
        model = with_lora(tiny_gpt2(PRESET))
        clock = StepClock()
        trainer = Trainer(model=model, args=targs, train_dataset=SampleDataset(steps * MICRO),
                          callbacks=[clock.callback])
        for printer in (PrinterCallback, ProgressCallback):
            trainer.remove_callback(printer)
        trainer.train()
        engine = trainer.model_wrapped
        config = read_config(path)
        zero = config["zero_optimization"]
        moves = [k.removeprefix("offload_") for k in zero_rules.OFFLOAD_MOVES if zero.get(k, {}).get("device") == "cpu"]
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        n_trainable, total = trainable_numel(model)
        record(OneDevice(config=os.path.basename(path), stage=int(zero["stage"]), offload=moves, device=device,
                         dtype=str(engine.get_data_types()[0]).removeprefix("torch."),
                         model=os.environ.get(SIZE_ENV) or PRESET, total=total, trainable=n_trainable,
                         optimizer=type(engine.optimizer.optimizer if hasattr(engine.optimizer, "optimizer")
                                        else engine.optimizer).__name__,
                         step_seconds=clock.seconds[1:],
                         device_peak_reserved=torch.cuda.max_memory_reserved() if device == "cuda" else 0,
                         host_peak_rss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, losses=losses))
        rank0_print(f"{os.path.basename(path)}: {n_trainable:,} of {total:,} parameters trained on {device}, "
                    f"loss {losses[0]:.3f} → {losses[-1]:.3f}")
        release(engine)
        unset_hf_deepspeed_config()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--stages", type=int, nargs="*", default=[0, 2, 3])
    parser.add_argument("--exercise", nargs="+", default=None, metavar=("R", "TARGET"),
                        help="also measure at stage 3 an adapter of rank R on these target modules")
    parser.add_argument("--steps", type=int, default=6, help="training steps of each run")
    parser.add_argument("--adapter_state", metavar="FILE",
                        help="only: save the adapter with the adapter_state(model) this file defines (needs --base)")
    parser.add_argument("--base", help="the pretrained checkpoint --adapter_state loads (a run's base/ folder)")
    parser.add_argument("--one_device", nargs="+", default=None, metavar="CONFIG",
                        help="only: LoRA through the Trainer on one rank with each of these configs (bf16)")
    return parser


def main(argv=None) -> None:
    args = parse_args(build_parser(), argv)
    deepspeed.init_distributed()
    if args.one_device:
        one_device(args.one_device, args.steps)
        return finish()
    if args.adapter_state:
        yours_saved(args.adapter_state, args.base, args.steps)
        return finish()
    base = save_base()
    gc.freeze()       # what the imports made never becomes garbage: the gc.collect calls of DeepSpeed (building and
                      # freeing engines) and of release() then walk only what comes after
    for stage in args.stages:                          # 1 · what each rank holds, full vs LoRA
        for kind in ("full", "lora"):
            measure(stage, kind, LORA_R, list(LORA_TARGETS))
    if args.exercise:
        measure(3, "exercise", int(args.exercise[0]), args.exercise[1:])
    activations()
    engine, keep_alive = zero3_engine(base, args.steps)   # 2 · loading, training
    pitfall_and_fix(engine)                            # 3 · saving
    release(engine)
    del keep_alive
    unset_hf_deepspeed_config()
    model = with_lora(GPT2LMHeadModel.from_pretrained(base))            # the same pretrained base, loaded whole
    engine, *_ = deepspeed.initialize(model=model, model_parameters=trainable(model), config=zero_config(2))
    record(Losses(label="raw loop, ZeRO-2", losses=[train_step(engine, s) for s in range(args.steps)]))
    release(engine)
    if args.deepspeed_config:                          # 4 · the Trainer, with the config that says "auto"
        release(trainer_run(base, args.deepspeed_config, args.steps, None).model_wrapped)
        trainer_save(trainer_run(base, args.deepspeed_config, args.steps, "ForCausalLM"))
    finish()


if __name__ == "__main__":
    main()
