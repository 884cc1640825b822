"""Checkpoints of a tiny GPT-2 under ZeRO: save them, resume from them, export them.

Modes (one launch each):
  layout  one engine per ZeRO stage 0-3: train, save_checkpoint(<out>/stage<N>), and save the live
          full fp32 weights beside it (<out>/stage<N>_live.safetensors) to compare conversions with;
          ZeRO-3 also tries save_16bit_model with stage3_gather_16bit_weights_on_model_save off and on.
  train   train to --steps, saving a checkpoint at each --save_at step; --load resumes from a
          checkpoint first (--universal: from a universal checkpoint, on any number of ranks).
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
from course_utils.rank.record import record
from course_utils.rank.scaffolding import finish, load_config, parse_args, rank0_print


def engine_config(base: dict, stage: int, universal: bool = False, **zero_options) -> dict:
    """The launch's config under ZeRO ``stage`` (plus ``zero_options``), loading universal checkpoints if asked."""
    config = copy.deepcopy(base)
    config["zero_optimization"].update(stage=stage, **zero_options)
    if universal:
        config["checkpoint"] = {"load_universal": True}
    return config


def engine_for(config: dict):
    """A fresh tiny GPT-2 (same seed every time) under ``config``."""
    model = tiny_gpt2("checkpoints", seed=0)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    return engine


def train_step(engine, step: int, device: str) -> float:
    """One optimizer step on global batch ``step``; returns the loss averaged over all ranks."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    batch = rank_slice(global_batch(step, engine.train_batch_size()), rank, world_size).to(device)
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


def layout(args, base: dict, out: Path, device: str) -> None:
    """One engine per ZeRO stage: train, save its checkpoint and its live weights; ZeRO-3's 16-bit export."""
    for stage in (0, 1, 2, 3):
        zero = {"stage3_gather_16bit_weights_on_model_save": True} if stage == 3 else {}
        engine = engine_for(engine_config(base, stage, args.universal, **zero))
        for step in range(args.steps):
            train_step(engine, step, device)
        engine.save_checkpoint(str(out / f"stage{stage}"), client_state={"step": args.steps})
        save_live(engine, out / f"stage{stage}_live.safetensors")
        rank0_print(f"stage {stage}: checkpoint saved to {out / f'stage{stage}'}")
    # ZeRO-3 keeps only a slice of each weight per rank: what does a plain state_dict() hold?
    shapes = {k: list(v.shape) for k, v in engine.module.state_dict().items()}
    record("zero3_state_dict_numel", sum(torch.Size(s).numel() for s in shapes.values()))
    record("zero3_state_dict_shapes", dict(list(shapes.items())[:3]))
    record("save16_gather_on", engine.save_16bit_model(str(out / "stage3_16bit_on")))
    engine = engine_for(engine_config(base, 3, args.universal, stage3_gather_16bit_weights_on_model_save=False))
    record("save16_gather_off", engine.save_16bit_model(str(out / "stage3_16bit_off")))
    record("model_numel", sum(p.ds_numel for p in engine.module.parameters()))


def train(args, base: dict, out: Path, device: str) -> None:
    """Train to --steps (resuming from --load first), saving at --save_at; record losses and final logits."""
    engine = engine_for(engine_config(base, base["zero_optimization"]["stage"], args.universal))
    first = 0
    if args.load:
        path, client_state = engine.load_checkpoint(args.load, tag=args.tag)
        if path is None:
            raise FileNotFoundError(f"No checkpoint found in {args.load}")
        first = client_state["step"] if client_state else engine.global_steps
        rank0_print(f"resumed from {path} at step {first} on {dist.get_world_size()} ranks (client_state={client_state})")
        record("resumed_at", first)
    for step in range(first, args.steps):
        loss = train_step(engine, step, device)
        record("loss", [step + 1, loss])
        rank0_print(f"step {step + 1:3d}  loss {loss:.6f}  lr {engine.get_lr()[0]:.2e}")
        if step + 1 in args.save_at:
            engine.save_checkpoint(str(out), tag=f"global_step{step + 1}", client_state={"step": step + 1})
    save_live(engine, out / "final_live.safetensors")
    engine.eval()
    with torch.no_grad():
        logits = engine(input_ids=fixed_batch().to(device)).logits
    record("final_logits", logits.float().cpu())
    record("world_size", dist.get_world_size())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=["layout", "train"], required=True)
    parser.add_argument("--out", required=True, help="folder for checkpoints and exported weights")
    parser.add_argument("--steps", type=int, default=4, help="train until this global step")
    parser.add_argument("--save_at", type=int, nargs="*", default=[], help="save a checkpoint after these steps")
    parser.add_argument("--load", default=None, help="checkpoint folder to resume from")
    parser.add_argument("--tag", default=None, help="which checkpoint of --load (default: the one named in `latest`)")
    parser.add_argument("--universal", action="store_true", help="--load names a universal checkpoint")
    return parser


def main(argv=None) -> None:
    args = parse_args(build_parser(), argv)
    deepspeed.init_distributed()
    device = get_accelerator().device_name(args.local_rank)
    (layout if args.mode == "layout" else train)(args, load_config(args), Path(args.out), device)
    finish()


if __name__ == "__main__":
    main()
