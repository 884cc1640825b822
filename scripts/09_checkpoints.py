"""Checkpoints of a tiny GPT-2 under ZeRO: save them, resume from them, export them.

Modes (one launch each):
  layout  one engine per precision (--dtypes, fp32 and bf16) and ZeRO stage 0-3: train,
          save_checkpoint(<out>/<dtype>/stage<N>); the fp32 engines also save the live full weights beside
          it (<out>/fp32/stage<N>_live.safetensors) to compare conversions with. The ZeRO-3 engines try
          save_16bit_model (<out>/<dtype>/stage3_16bit_on), and an fp32 one with
          stage3_gather_16bit_weights_on_model_save off; --trainer_save also has the HF Trainer save a
          ZeRO-3 model with that option on and off (<out>/trainer/gather_on, gather_off); --large_zero3 also
          saves a ZeRO-3 checkpoint of a bigger GPT-2 (<out>/large/stage3), for the conversion under a memory limit;
          --run_a FOLDER then trains one more engine as `train` does (--run_a_steps, saving at --save_at).
  train   train to optimizer step --steps, accumulating gradients over --grad_accum batches of the data stream per
          optimizer step (the loop's `step` counts those batches, DeepSpeed's global_steps the optimizer steps),
          saving a checkpoint at each --save_at optimizer step; --load resumes from a
          checkpoint first (--universal: from a universal checkpoint, on any number of ranks; --plain_tag: first try
          a plain load_checkpoint of that ZeRO checkpoint on this number of ranks, and record DeepSpeed's refusal), with
          resume() from the file --resume_file names (notebook 09's exercise) or, without one, course_resume.
          Records the loss of every step, and the logits of a fixed batch at the end.

Run from a terminal:
  deepspeed --num_gpus 2 scripts/09_checkpoints.py --mode train --steps 20 --save_at 10 \
      --out build/ckpt --deepspeed_config configs/09_checkpoints.json
"""
import argparse
import copy
from pathlib import Path

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.accelerator import get_accelerator
from safetensors.torch import save_file

from course_utils.rank.data import fixed_batch, global_batch, rank_slice
from course_utils.rank.models import tiny_gpt2
from course_utils.common.record import record
from course_utils.common.records.checkpoints import Saved
from course_utils.rank.scaffolding import finish, load_config, load_exercise, parse_args, rank0_print


def engine_config(base: dict, stage: int, universal: bool = False, dtype: str = "fp32", accumulate: int = 1,
                  **zero_options) -> dict:
    """The launch's config under ZeRO ``stage`` (plus ``zero_options``) in ``dtype`` ("fp32" keeps the
    launch's config, "bf16" turns bf16 on), loading universal checkpoints if asked; ``accumulate`` batches of the
    launch's size per optimizer step (gradient accumulation: the global batch grows by that factor)."""
    if dtype not in ("fp32", "bf16"):
        raise ValueError(f"dtype must be 'fp32' or 'bf16', not {dtype!r}")
    config = copy.deepcopy(base)
    config["zero_optimization"].update(stage=stage, **zero_options)
    if accumulate != 1:
        per_step = base["train_batch_size"] // base.get("gradient_accumulation_steps", 1)
        config.update(train_batch_size=per_step * accumulate, gradient_accumulation_steps=accumulate)
    if dtype == "bf16":
        config["bf16"] = {"enabled": True}
    if universal:
        config["checkpoint"] = {"load_universal": True}
    return config


def engine_for(config: dict):
    """A fresh tiny GPT-2 (same seed every time) under ``config``."""
    model = tiny_gpt2("checkpoints", seed=0)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    return engine


def train_step(engine, step: int, device: str) -> float:
    """Forward and backward on batch ``step`` of the data stream (one micro-batch per rank), then engine.step(),
    which steps the optimizer every gradient_accumulation_steps batches; returns the loss averaged over all ranks."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    size = engine.train_micro_batch_size_per_gpu() * world_size       # the stream's batch: 8 sequences, any world size
    batch = rank_slice(global_batch(step, size), rank, world_size).to(device)
    loss = engine(input_ids=batch, labels=batch).loss
    engine.backward(loss)
    engine.step()
    mean = loss.detach().clone()
    dist.all_reduce(mean)
    return mean.item() / world_size


def live_weights(engine) -> dict:
    """The full fp32 weights as the running engine holds them (ZeRO-3: gathered from every rank)."""
    params = list(engine.module.parameters())
    with deepspeed.zero.GatheredParameters(params, enabled=engine.zero_optimization_stage() == 3):
        return {k: v.detach().cpu().clone() for k, v in engine.module.state_dict().items()}


def save_live(engine, path: Path) -> None:
    weights = live_weights(engine)          # every rank takes part in the gather
    if dist.get_rank() == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file(weights, str(path))


def zero3_state(engine) -> dict:
    """Under ZeRO-3, what a plain ``module.state_dict()`` holds now: its elements, and the elements of the
    parameters ZeRO-3 keeps whole on every rank (``ds_persist``: at most stage3_param_persistence_threshold
    elements each; they stay gathered once the first forward has fetched them)."""
    state = engine.module.state_dict()
    params = engine.module.named_parameters(remove_duplicate=False)     # tied weights appear in state_dict twice
    return {"state_dict_numel": sum(v.numel() for v in state.values()),
            "persistent_numel": sum(p.ds_numel for _, p in params if getattr(p, "ds_persist", False)),
            "shapes": {k: list(v.shape) for k, v in list(state.items())[:3]}}


def layout(args, base: dict, out: Path, device: str) -> None:
    """One engine per precision and ZeRO stage: train, save its checkpoint (fp32: and its live weights);
    ZeRO-3's state_dict and 16-bit export; the HF Trainer's save_model under ZeRO-3 if asked; then, with --run_a,
    the uninterrupted run that notebook 09's launch B resumes."""
    for dtype in args.dtypes:
        for stage in (0, 1, 2, 3):
            zero = {"stage3_gather_16bit_weights_on_model_save": True} if stage == 3 else {}
            engine = engine_for(engine_config(base, stage, args.universal, dtype, **zero))
            if stage == 3 and dtype == "fp32":
                record("zero3_built", zero3_state(engine))
            for step in range(args.steps):
                train_step(engine, step, device)
            if stage == 3 and dtype == "fp32":
                record("zero3_trained", zero3_state(engine))
            engine.save_checkpoint(str(out / dtype / f"stage{stage}"), client_state={"step": args.steps})
            record(Saved(dtype=dtype, stage=stage, optimizer=type(engine.optimizer).__name__,
                         param_dtype=str(next(engine.module.parameters()).dtype).replace("torch.", "")))
            if dtype == "fp32":
                save_live(engine, out / dtype / f"stage{stage}_live.safetensors")
            if stage == 3:
                record(f"{dtype}_save16_gather_on", engine.save_16bit_model(str(out / dtype / "stage3_16bit_on")))
            rank0_print(f"{dtype} stage {stage}: checkpoint saved to {out / dtype / f'stage{stage}'}")
    # the gather option off, and no persistent parameters: what a real model's big matrices look like
    engine = engine_for(engine_config(base, 3, args.universal, stage3_gather_16bit_weights_on_model_save=False,
                                      stage3_param_persistence_threshold=0))
    train_step(engine, 0, device)
    record("zero3_trained_no_persistence", zero3_state(engine))
    record("save16_gather_off", engine.save_16bit_model(str(out / "fp32" / "stage3_16bit_off")))
    record("model_numel", sum(p.ds_numel for p in engine.module.parameters()))
    if args.trainer_save:
        trainer_saves(out / "trainer")
    if args.large_zero3:
        large_zero3(base, out / "large" / "stage3", device)
    if args.run_a:      # section 2's uninterrupted run: one engine more, at the config's stage, saving at --save_at
        rank0_print(f"run A: {args.run_a_steps} optimizer steps of {args.grad_accum} batches each, at the config's stage "
                    f"{base['zero_optimization']['stage']}, "
                    f"checkpoints after steps {args.save_at} in {args.run_a}")
        train(argparse.Namespace(**{**vars(args), "steps": args.run_a_steps, "load": None, "plain_tag": None,
                                    "resume_file": None}), base, Path(args.run_a), device)


def large_zero3(base: dict, out: Path, device: str) -> None:
    """A ZeRO-3 checkpoint of ``tiny_gpt2("zero_lab")`` (~13.8 M parameters, 55 MB of fp32 weights): big enough that
    converting it takes memory worth a limit, small enough to save in a second."""
    model = tiny_gpt2("zero_lab", seed=0)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=engine_config(base, 3))
    train_step(engine, 0, device)
    engine.save_checkpoint(str(out), client_state={"step": 1})
    record("large_numel", sum(p.ds_numel for p in engine.module.parameters()))
    rank0_print(f"ZeRO-3 checkpoint of a {sum(p.ds_numel for p in engine.module.parameters()) / 1e6:.1f} M-parameter "
                f"GPT-2 saved to {out}")


def plain_load_refused(base: dict, folder: str, tag: str, accumulate: int) -> None:
    """Try a plain ``load_checkpoint`` of ZeRO checkpoint ``tag`` on this launch's number of ranks and record how
    DeepSpeed refuses it (``_load_zero_checkpoint`` in runtime/engine.py), as Python would print its last line."""
    engine = engine_for(engine_config(base, base["zero_optimization"]["stage"], accumulate=accumulate))
    try:
        engine.load_checkpoint(folder, tag=tag)
    except Exception as err:     # the refusal is the lesson: keep it, then resume the way that works
        said = f"{type(err).__module__}.{type(err).__name__}: {err}"
        record("plain_load_error", said)
        rank0_print(f"plain load_checkpoint({tag}) on {dist.get_world_size()} rank(s) failed:\n{said}")
        return
    record("plain_load_error", "")


def trainer_saves(out: Path) -> None:
    """The HF Trainer under ZeRO-3, one step, then ``trainer.save_model``: with
    stage3_gather_16bit_weights_on_model_save on (out/gather_on) and off (out/gather_off)."""
    from accelerate.state import AcceleratorState
    from transformers import Trainer
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config
    from transformers.trainer_callback import PrinterCallback
    from transformers.utils import logging as hf_logging

    from course_utils.rank.trainer import training_arguments

    hf_logging.disable_progress_bar()            # no "Writing model shards" bars in the rank logs
    data = [{"input_ids": x, "labels": x} for x in global_batch(0, 8)]
    for gather in (True, False):
        AcceleratorState._reset_state()          # forget the previous run's DeepSpeed plugin
        config = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
                  "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "steps_per_print": 1000000,
                  "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                            "weight_decay": "auto"}},
                  "zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": gather}}
        targs = training_arguments(output_dir=str(out / "run"), deepspeed=config, max_steps=1, save_strategy="no",
                                   per_device_train_batch_size=len(data) // dist.get_world_size(),
                                   logging_strategy="no", dataloader_pin_memory=False)
        trainer = Trainer(model=tiny_gpt2("checkpoints", seed=0), args=targs, train_dataset=data)
        trainer.remove_callback(PrinterCallback)     # the one step's metrics are not the point here
        trainer.train()
        trainer.save_model(str(out / ("gather_on" if gather else "gather_off")))
        rank0_print(f"Trainer.save_model with stage3_gather_16bit_weights_on_model_save={gather}: "
                    f"{out / ('gather_on' if gather else 'gather_off')}")
    unset_hf_deepspeed_config()


def course_resume(engine, folder: str, tag: str | None) -> int:
    """Load checkpoint ``tag`` of ``folder`` into ``engine`` on every rank (weights, optimizer partitions, scheduler,
    DeepSpeed's step counters) and return the first step still to train: the data position, which DeepSpeed does
    not keep itself, stored by this script in ``client_state`` when it saved. ``load_checkpoint`` finding nothing
    returns ``(None, None)`` with a warning only: a resume that would silently start again from scratch is an error."""
    path, client_state = engine.load_checkpoint(folder, tag=tag)
    if path is None:
        raise FileNotFoundError(f"No checkpoint {tag or '(latest)'} in {folder}")
    return client_state["step"]


def train(args, base: dict, out: Path, device: str) -> None:
    """Train to --steps (resuming from --load first), saving at --save_at; record losses and final logits."""
    if args.plain_tag:
        plain_load_refused(base, args.load, args.plain_tag, args.grad_accum)
    engine = engine_for(engine_config(base, base["zero_optimization"]["stage"], args.universal, accumulate=args.grad_accum))
    accumulate = engine.gradient_accumulation_steps()
    record("gradient_accumulation_steps", accumulate)
    resume, whose = course_resume, "course"
    if args.resume_file:                 # the learner's resume(engine, folder, tag), exported from the notebook
        resume, whose = load_exercise(args.resume_file, ["resume"])["resume"], "yours"
    first = 0
    if args.load:
        first = resume(engine, args.load, args.tag)
        if not isinstance(first, int):
            raise TypeError(f"{whose} resume() returned a {type(first).__name__}: it must return the first step to train, "
                            f"an int")
        rank0_print(f"{whose} resume(): continue at step {first} on {dist.get_world_size()} ranks; "
                    f"engine.global_steps {engine.global_steps}, lr {engine.get_lr()[0]:.2e}")
        record("resumed_by", whose)
        record("resumed_at", first)
        record("global_steps_after_load", engine.global_steps)     # DeepSpeed's own counter, restored from the checkpoint
    losses = []
    for step in range(first, args.steps * accumulate):   # the script's step: one batch of the data stream
        boundary = engine.is_gradient_accumulation_boundary()      # this batch's engine.step() steps the optimizer
        losses.append(train_step(engine, step, device))
        if not boundary:
            continue
        optimizer_step = (step + 1) // accumulate      # where this batch lies in the stream, in optimizer steps
        loss, losses = sum(losses) / len(losses), []
        record("loss", [optimizer_step, loss])
        rank0_print(f"optimizer step {optimizer_step:3d} (batches read {step + 1:3d})  loss {loss:.6f}  "
                    f"lr {engine.get_lr()[0]:.2e}")
        if engine.global_steps in args.save_at:       # the data position, in batches read, travels in client_state
            engine.save_checkpoint(str(out), tag=f"global_step{engine.global_steps}", client_state={"step": step + 1})
    engine.eval()
    with torch.no_grad():
        logits = engine(input_ids=fixed_batch().to(device)).logits
    record("final_logits", logits.float().cpu())
    record("world_size", dist.get_world_size())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=["layout", "train"], required=True)
    parser.add_argument("--out", required=True, help="folder for checkpoints and exported weights")
    parser.add_argument("--steps", type=int, default=4, help="train until this optimizer step (DeepSpeed's global step)")
    parser.add_argument("--grad_accum", type=int, default=2,
                        help="train: batches of the data stream (micro-batches) per optimizer step; layout engines take 1")
    parser.add_argument("--save_at", type=int, nargs="*", default=[], help="save a checkpoint after these optimizer steps")
    parser.add_argument("--load", default=None, help="checkpoint folder to resume from")
    parser.add_argument("--tag", default=None, help="which checkpoint of --load (default: the one named in `latest`)")
    parser.add_argument("--universal", action="store_true", help="--load names a universal checkpoint")
    parser.add_argument("--plain_tag", default=None,
                        help="first try a plain load_checkpoint of this ZeRO checkpoint of --load, and record the error")
    parser.add_argument("--resume_file", default=None,
                        help="a file defining resume(engine, folder, tag) -> first step, used instead of course_resume")
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"],
                        help="layout: the precisions to save checkpoints in")
    parser.add_argument("--trainer_save", action="store_true",
                        help="layout: also save a ZeRO-3 model through the HF Trainer, gather option on and off")
    parser.add_argument("--large_zero3", action="store_true",
                        help="layout: also save a ZeRO-3 checkpoint of a bigger GPT-2 (<out>/large/stage3)")
    parser.add_argument("--run_a", default=None,
                        help="layout: then train an uninterrupted run into this folder, as --mode train does, for "
                        "--run_a_steps steps, saving at --save_at")
    parser.add_argument("--run_a_steps", type=int, default=8, help="layout: the steps of --run_a")
    return parser


def main(argv=None) -> None:
    args = parse_args(build_parser(), argv)
    deepspeed.init_distributed()
    device = get_accelerator().device_name(args.local_rank)
    (layout if args.mode == "layout" else train)(args, load_config(args), Path(args.out), device)
    finish()


if __name__ == "__main__":
    main()
