"""The Hugging Face optimizer/scheduler × DeepSpeed optimizer/scheduler matrix, through the real Trainer.

For each combination (HF or DS optimizer) × (HF or DS scheduler) × (ZeRO-Offload or not), the
DeepSpeed config loses the sections Hugging Face should provide, a Trainer trains a few steps, and the
outcome is recorded: "ok" with the optimizer and scheduler classes really used, or the error raised.
All combinations run one after another inside this one launch.

Run from a terminal:  deepspeed --num_gpus 2 scripts/07_trainer_matrix.py --deepspeed_config configs/07_trainer_base.json
"""
import argparse
import tempfile
from dataclasses import dataclass

from accelerate.state import AcceleratorState
from transformers import Trainer

from course_utils.rank.data import counting_dataset
from course_utils.rank.models import tiny_gpt2
from course_utils.rank.record import Record, record
from course_utils.rank.scaffolding import finish, load_config, parse_args, rank0_print
from course_utils.rank.trainer import combo_config, combo_key, combos, training_arguments


@dataclass
class Combo(Record, name="combo"):
    """One cell of the matrix: a Trainer run with this combination, and what happened."""
    key: str                              # combo_key: "hf_opt+ds_sched", "+offload" appended for ZeRO-Offload
    outcome: str                          # "ok" or the error's class name
    optimizer_class: str | None = None
    scheduler_class: str | None = None
    train_loss: float | None = None
    world_size: int | None = None
    error: str | None = None


def try_combo(base: dict, hf_opt: bool, hf_sched: bool, offload: bool, steps: int, data) -> Combo:
    """Train ``steps`` steps with one combination; the previous Trainer's DeepSpeed plugin is forgotten first."""
    key = combo_key(hf_opt, hf_sched, offload)
    AcceleratorState._reset_state()      # forget the previous Trainer's DeepSpeed plugin, keep the process group
    try:
        targs = training_arguments(output_dir=tempfile.mkdtemp(), deepspeed=combo_config(base, hf_opt, hf_sched, offload),
                                   per_device_train_batch_size=4, max_steps=steps, learning_rate=1e-3,
                                   warmup_steps=1, lr_scheduler_type="linear", logging_steps=1, save_strategy="no")
        trainer = Trainer(model=tiny_gpt2("trainer"), args=targs, train_dataset=data)
        out = trainer.train()
        engine = trainer.model_wrapped
        inner = getattr(engine.optimizer, "optimizer", engine.optimizer)
        return Combo(key=key, outcome="ok", optimizer_class=type(inner).__name__,
                     scheduler_class=type(engine.lr_scheduler or trainer.lr_scheduler).__name__,
                     train_loss=out.training_loss, world_size=targs.world_size)
    except Exception as err:
        return Combo(key=key, outcome=type(err).__name__, error=" ".join(str(err).split())[:400])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=3, help="training steps per combination")
    parser.add_argument("--no_offload", action="store_true", help="skip the ZeRO-Offload half of the matrix")
    return parser


def main(argv=None) -> None:
    args = parse_args(build_parser(), argv)
    base = load_config(args)
    data = counting_dataset()
    for hf_opt, hf_sched, offload in combos((False,) if args.no_offload else (False, True)):
        combo = try_combo(base, hf_opt, hf_sched, offload, args.steps, data)
        record(combo)
        rank0_print(f"{combo.key:28s} {combo}")
    finish()


if __name__ == "__main__":
    main()
