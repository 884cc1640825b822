"""The Hugging Face optimizer/scheduler × DeepSpeed optimizer/scheduler matrix, through the real Trainer.

For each combination (HF or DS optimizer) × (HF or DS scheduler) × (ZeRO-Offload or not), the
DeepSpeed config loses the sections Hugging Face should provide, a Trainer trains a few steps, and the
outcome is recorded: "ok" with the optimizer and scheduler classes really used, or the error raised.
All combinations run one after another inside this one launch.

Run from a terminal:  deepspeed --num_gpus 2 scripts/07_trainer_matrix.py --deepspeed_config configs/07_trainer_base.json
"""
import argparse
import json
import tempfile

from accelerate.state import AcceleratorState
from transformers import Trainer

from course_utils import record
from course_utils.hf_integration import combo_config, combo_key, combos, counting_dataset, tiny_gpt2_for_trainer
from course_utils.scripting import finish, parse_args, rank0_print
from course_utils.trainer import training_arguments

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--steps", type=int, default=3, help="training steps per combination")
parser.add_argument("--no_offload", action="store_true", help="skip the ZeRO-Offload half of the matrix")
args = parse_args(parser)
base = json.load(open(args.deepspeed_config))
data = counting_dataset()

for hf_opt, hf_sched, offload in combos((False,) if args.no_offload else (False, True)):
    key = combo_key(hf_opt, hf_sched, offload)
    AcceleratorState._reset_state()      # forget the previous Trainer's DeepSpeed plugin, keep the process group
    try:
        targs = training_arguments(output_dir=tempfile.mkdtemp(), deepspeed=combo_config(base, hf_opt, hf_sched, offload),
                                   per_device_train_batch_size=4, max_steps=args.steps, learning_rate=1e-3,
                                   warmup_steps=1, lr_scheduler_type="linear", logging_steps=1, save_strategy="no")
        trainer = Trainer(model=tiny_gpt2_for_trainer(), args=targs, train_dataset=data)
        out = trainer.train()
        engine = trainer.model_wrapped
        inner = getattr(engine.optimizer, "optimizer", engine.optimizer)
        result = {"outcome": "ok", "optimizer_class": type(inner).__name__,
                  "scheduler_class": type(engine.lr_scheduler or trainer.lr_scheduler).__name__,
                  "train_loss": out.training_loss, "world_size": targs.world_size}
    except Exception as err:
        result = {"outcome": type(err).__name__, "error": " ".join(str(err).split())[:400]}
    record("combo", {"key": key, **result})
    rank0_print(f"{key:28s} {result}")
finish()
