"""The Hugging Face optimizer/scheduler × DeepSpeed optimizer/scheduler matrix, through the real Trainer.

For each combination (HF or DS optimizer) × (HF or DS scheduler) × (ZeRO-Offload or not), the
DeepSpeed config loses the sections Hugging Face should provide, a Trainer trains a few steps, and the
outcome is recorded: "ok" with the optimizer and scheduler classes really used, or the error raised.
Then the entries of course_utils.rank.trainer.OFFLOAD_VARIANTS (HF optimizer + HF scheduler + offload with one
argument or config key changed), and a control: optim="sgd" without offload, where torch's SGD really steps. Every
run trains the tiny GPT-2 on counting sequences (learnable) with a learning rate that moves it, and records each
step's loss. All combinations run one after another inside this one launch.

Run from a terminal:  deepspeed --num_gpus 2 scripts/07_trainer_matrix.py --deepspeed_config configs/07_trainer_base.json
"""
import argparse

from accelerate.state import AcceleratorState
from transformers import Trainer

from course_utils.rank.data import counting_dataset
from course_utils.rank.models import tiny_gpt2
from course_utils.common.record import record
from course_utils.common.records.schedules import Combo
from course_utils.rank.scaffolding import finish, load_config, parse_args, rank0_print, scratch_dir
from course_utils.rank.trainer import OFFLOAD_VARIANTS, combo_config, combo_key, combos, training_arguments


SGD_CONTROL = "optim=sgd"           # the offload variant's argument, run once more without offload


def try_combo(base: dict, hf_opt: bool, hf_sched: bool, offload: bool, steps: int, lr: float, data,
              variant: str | None = None) -> Combo:
    """Train ``steps`` steps with one combination (changed by ``OFFLOAD_VARIANTS[variant]`` if given); the
    previous Trainer's DeepSpeed plugin is forgotten first."""
    key = combo_key(hf_opt, hf_sched, offload, variant)
    extra_args, extra_config = OFFLOAD_VARIANTS[variant] if variant else ({}, {})
    AcceleratorState._reset_state()      # forget the previous Trainer's DeepSpeed plugin, keep the process group
    try:
        config = {**combo_config(base, hf_opt, hf_sched, offload), **extra_config}
        targs = training_arguments(output_dir=scratch_dir(), deepspeed=config,
                                   per_device_train_batch_size=4, max_steps=steps, learning_rate=lr,
                                   warmup_steps=1, lr_scheduler_type="linear", logging_steps=1, save_strategy="no",
                                   **extra_args)
        trainer = Trainer(model=tiny_gpt2("trainer"), args=targs, train_dataset=data)
        out = trainer.train()
        engine = trainer.model_wrapped
        inner = getattr(engine.optimizer, "optimizer", engine.optimizer)
        return Combo(key=key, outcome="ok", variant=variant, optimizer_class=type(inner).__name__,
                     adam_w_mode=getattr(inner, "adam_w_mode", None),
                     scheduler_class=type(engine.lr_scheduler or trainer.lr_scheduler).__name__,
                     train_loss=out.training_loss, world_size=targs.world_size,
                     losses=[entry["loss"] for entry in trainer.state.log_history if "loss" in entry])
    except Exception as err:
        return Combo(key=key, outcome=type(err).__name__, variant=variant, error=" ".join(str(err).split())[:400])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=12, help="training steps per combination")
    parser.add_argument("--learning_rate", type=float, default=1e-2, help="the Trainer's learning_rate (the peak of both schedules)")
    parser.add_argument("--no_offload", action="store_true",
                        help="skip the ZeRO-Offload half of the matrix and the offload variants")
    return parser


def main(argv=None) -> None:
    args = parse_args(build_parser(), argv)
    base = load_config(args)
    data = counting_dataset()
    runs = [(*c, None) for c in combos((False,) if args.no_offload else (False, True))]
    runs += [] if args.no_offload else [(True, True, True, variant) for variant in OFFLOAD_VARIANTS]
    runs += [(True, True, False, SGD_CONTROL)]     # torch's SGD really stepping: what optim="sgd" trains like
    for hf_opt, hf_sched, offload, variant in runs:
        combo = try_combo(base, hf_opt, hf_sched, offload, args.steps, args.learning_rate, data, variant)
        record(combo)
        rank0_print(f"{combo.key:28s} {combo}")
    finish()


if __name__ == "__main__":
    main()
