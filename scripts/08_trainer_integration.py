"""The Hugging Face Trainer on DeepSpeed ranks: "auto" resolved, config as a path and as a dict,
the mismatch error, and HfDeepSpeedConfig before from_pretrained under ZeRO-3.

1. Trainer with TrainingArguments(deepspeed=<path>): records the config as DeepSpeed received it and
   which TrainingArguments field filled each "auto" value.
2. The same with deepspeed=<dict>: the same run (the same losses).
3. Config values that contradict TrainingArguments (lr, betas, warmup_num_steps): the one error the Trainer raises.
4. ZeRO-3: from_pretrained with and without a live HfDeepSpeedConfig: partitioned or not.
5. The same config without the Trainer: plain deepspeed.initialize and zero.Init meet "auto"; then the two fixes,
   transformers filling it (as the Trainer does) and numbers written in, key group by key group.
Run from a terminal:  deepspeed --num_gpus 2 scripts/08_trainer_integration.py --deepspeed_config configs/08_trainer.json
"""
import copy
import os
import re
import shutil
import traceback

import deepspeed
import torch.distributed as dist
from accelerate.state import AcceleratorState
from transformers import GPT2LMHeadModel, Trainer
from transformers.integrations import HfDeepSpeedConfig
from transformers.integrations.deepspeed import unset_hf_deepspeed_config

from course_utils.common import run_folder
from course_utils.rank.data import counting_dataset
from course_utils.rank.models import tiny_gpt2
from course_utils.common.record import record
from course_utils.common.records.trainer import AutoOutside, EngineView, Zero3Load, build_parser, trainer_settings
from course_utils.rank.scaffolding import finish, load_config, parse_args, rank0_print, scratch_dir
from course_utils.rank.trainer import AutoFill, recording_auto_fills, training_arguments


# The TrainingArguments fields part 1 records (what the Trainer had to fill "auto" from).
ARGUMENTS = ("per_device_train_batch_size", "gradient_accumulation_steps", "world_size", "learning_rate",
             "max_grad_norm", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "warmup_steps", "max_steps")


def train(args, deepspeed_config, data) -> tuple[Trainer, list[float]]:
    """One Trainer run; the DeepSpeed plugin of the previous run is forgotten first."""
    AcceleratorState._reset_state()
    targs = training_arguments(output_dir=scratch_dir(), deepspeed=deepspeed_config, **trainer_settings(args))
    rank0_print(f"TrainingArguments: world_size={targs.world_size}, parallel_mode={targs.parallel_mode}")
    trainer = Trainer(model=tiny_gpt2("trainer"), args=targs, train_dataset=data)
    trainer.train()
    return trainer, [h["loss"] for h in trainer.state.log_history if "loss" in h]


def contradicting_config(written: dict, learning_rate: float) -> dict:
    """``written`` with three values that contradict :func:`trainer_settings`: the learning rate, the betas
    (TrainingArguments keep adam_beta1/2 = 0.9/0.999) and warmup_num_steps (warmup_steps=1 gives 1)."""
    config = copy.deepcopy(written)
    config["optimizer"]["params"]["lr"] = learning_rate * 10
    config["optimizer"]["params"]["betas"] = [0.9, 0.95]
    config["scheduler"]["params"]["warmup_num_steps"] = 3
    return config


def engine_view(engine) -> EngineView:
    """The batch sizes, clipping and classes the engine really uses."""
    return EngineView(train_batch_size=engine.train_batch_size(), micro_batch=engine.train_micro_batch_size_per_gpu(),
                      gradient_accumulation_steps=engine.gradient_accumulation_steps(),
                      gradient_clipping=engine.gradient_clipping(), world_size=dist.get_world_size(),
                      optimizer=type(engine.basic_optimizer).__name__, lr_scheduler=type(engine.lr_scheduler).__name__)


def zero3_loads() -> None:
    """4 · ZeRO-3: HfDeepSpeedConfig must be alive before from_pretrained."""
    # one folder every rank can read (the launch's run folder), removed again below so that no file outlives it
    folder = str(run_folder.here() / f"course08-tiny-gpt2-{os.environ.get('MASTER_PORT', '0')}")
    if dist.get_rank() == 0:
        tiny_gpt2("trainer").save_pretrained(folder)
    dist.barrier()
    zero3 = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 3}}
    unset_hf_deepspeed_config()                  # forget the Trainer runs' (ZeRO-2) config
    for label in ("without HfDeepSpeedConfig", "with HfDeepSpeedConfig"):
        keep_alive = HfDeepSpeedConfig(zero3) if label.startswith("with ") else None   # the Trainer holds one for you
        weight = GPT2LMHeadModel.from_pretrained(folder).transformer.wte.weight
        record(Zero3Load(label=label, local_shape=list(weight.shape), local_numel=weight.numel(),
                         ds_numel=getattr(weight, "ds_numel", None),
                         partition_numel=getattr(getattr(weight, "ds_tensor", None), "numel", lambda: None)()))
        del keep_alive
    dist.barrier()                               # every rank has loaded it
    if dist.get_rank() == 0:
        shutil.rmtree(folder, ignore_errors=True)


def hand_numbers(settings: dict, world_size: int) -> dict[str, dict]:
    """5 · A number for each "auto" that DeepSpeed reads itself, as a loop without the Trainer writes them (from part
    1's settings), grouped in the order such a loop meets their errors. The precision flags and the bucket size
    are left out: DeepSpeed's own config sections drop an "auto" (``DeepSpeedConfigModel``) and use their defaults."""
    micro, accum, lr = settings["per_device_train_batch_size"], settings["gradient_accumulation_steps"], settings["learning_rate"]
    return {
        "batch sizes": {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": accum,
                        "train_batch_size": micro * accum * world_size},
        "scheduler": {"scheduler.params.warmup_min_lr": 0, "scheduler.params.warmup_max_lr": lr,
                      "scheduler.params.warmup_num_steps": settings["warmup_steps"],
                      "scheduler.params.total_num_steps": settings["max_steps"]},
        "gradient_clipping": {"gradient_clipping": settings["max_grad_norm"]},
        "optimizer": {"optimizer.params.lr": lr, "optimizer.params.betas": [0.9, 0.999], "optimizer.params.eps": 1e-8,
                      "optimizer.params.weight_decay": settings["weight_decay"]},
    }


def with_numbers(config: dict, numbers: dict) -> dict:
    """A copy of ``config`` with each dotted key of ``numbers`` set to its value."""
    config = copy.deepcopy(config)
    for dotted, value in numbers.items():
        *path, leaf = dotted.split(".")
        node = config
        for key in path:
            node = node[key]
        node[leaf] = value
    return config


def frames(err: BaseException) -> list[str]:
    """The frames of ``err``'s traceback inside installed packages, outermost first, as "package/file.py:function"."""
    inside = [re.split(r"[/\\](?:site|dist)-packages[/\\]", f.filename, maxsplit=1) + [f.name]
              for f in traceback.extract_tb(err.__traceback__)]
    return [f"{parts[1]}:{parts[2]}" for parts in inside if len(parts) == 3] or ["(outside the installed packages)"]


def initialize_and_step(config: dict, steps: int, data) -> dict:
    """Plain ``deepspeed.initialize`` on the part-1 model, then ``steps`` training steps on this rank's rows."""
    model = tiny_gpt2("trainer")
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    micro = engine.train_micro_batch_size_per_gpu()
    rows = data[dist.get_rank() * micro:(dist.get_rank() + 1) * micro]["input_ids"].to(engine.device)
    losses = []
    for _ in range(steps):
        loss = engine(input_ids=rows, labels=rows).loss
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    figures = dict(train_batch_size=engine.train_batch_size(), reduce_bucket_size=engine.zero_reduce_bucket_size(),
                   fp16=engine.fp16_enabled(), losses=losses)
    engine.destroy()
    return figures


def build_under_zero_init(config: dict) -> dict:
    """The part-1 model built inside ``deepspeed.zero.Init(config_dict_or_path=config)``: its token embedding."""
    with deepspeed.zero.Init(config_dict_or_path=config):
        weight = tiny_gpt2("trainer").transformer.wte.weight
    return dict(local_numel=weight.numel(), ds_numel=getattr(weight, "ds_numel", None))


def attempt(label: str, call: str, numbers: list, run) -> AutoOutside:
    """One try of part 5: ``run()``'s figures, or the first line of what it raised and where."""
    try:
        return AutoOutside(label=label, call=call, numbers=numbers, **run())
    except Exception as err:        # every rank fails at the same line: nothing is left waiting in a collective
        first = (str(err).splitlines() or [""])[0]
        return AutoOutside(label=label, call=call, numbers=numbers, error=f"{type(err).__name__}: {first}",
                           where=frames(err))


def without_the_trainer(args, written: dict, data) -> list[AutoOutside]:
    """5 · The Trainer's config, "auto" and all, handed to DeepSpeed by a loop of its own; then the two fixes."""
    unset_hf_deepspeed_config()
    tries = [attempt("the Trainer's config", "deepspeed.initialize", [],
                     lambda: initialize_and_step(copy.deepcopy(written), args.steps, data)),
             attempt("the Trainer's config", "zero.Init", [], lambda: build_under_zero_init(copy.deepcopy(written)))]

    def filled_by_transformers() -> dict:     # fix 1: what the Trainer does, in two steps (section 3)
        AcceleratorState._reset_state()
        targs = training_arguments(output_dir=scratch_dir(), deepspeed=copy.deepcopy(written), **trainer_settings(args))
        hf_config = targs.hf_deepspeed_config        # trainer_config_process ran when targs was created
        hf_config.trainer_config_finalize(targs, tiny_gpt2("trainer"), args.steps)
        unset_hf_deepspeed_config()                  # the global that targs set (section 6): not needed here
        return initialize_and_step(hf_config.config, args.steps, data)
    tries.append(attempt("filled by transformers (HfTrainerDeepSpeedConfig)", "deepspeed.initialize", [],
                         filled_by_transformers))

    numbers: dict = {}
    groups: list[str] = []
    for group, values in hand_numbers(trainer_settings(args), dist.get_world_size()).items():   # fix 2, group by group
        numbers.update(values)
        groups.append(group)
        config, label = with_numbers(written, numbers), "numbers: " + " + ".join(groups)
        tries.append(attempt(label, "deepspeed.initialize", list(numbers), lambda: initialize_and_step(config, args.steps, data)))
        if group == "batch sizes":
            tries.append(attempt(label, "zero.Init", list(numbers), lambda: build_under_zero_init(config)))
    return tries


def main(argv=None) -> None:
    args = parse_args(build_parser(__doc__), argv)
    written = load_config(args)
    data = counting_dataset()

    # 1 · a path, with a record of every "auto" the Trainer fills
    with recording_auto_fills() as filled:   # part 1 always runs: the other parts compare with it
        trainer, losses_path = train(args, args.deepspeed_config, data)
    record(AutoFill.NAME, filled)
    record("received_config", trainer.args.hf_deepspeed_config.config)   # the dict handed to deepspeed.initialize
    record(engine_view(trainer.model_wrapped))
    record("losses_path", losses_path)
    record("training_arguments", {k: getattr(trainer.args, k) for k in ARGUMENTS})
    record("learning_rates", [h["learning_rate"] for h in trainer.state.log_history if "learning_rate" in h])

    # 2 · the same config as a dict
    if 2 in args.parts:
        _, losses_dict = train(args, copy.deepcopy(written), data)
        record("losses_dict", losses_dict)

    # 3 · values that contradict TrainingArguments
    if 3 in args.parts:
        contradicting = contradicting_config(written, args.learning_rate)
        record("mismatch_config", contradicting)
        try:
            train(args, contradicting, data)
            record("mismatch_error", None)
        except ValueError as err:
            record("mismatch_error", str(err))

    if 4 in args.parts:
        zero3_loads()

    # 5 · the same config without the Trainer
    if 5 in args.parts:
        record(AutoOutside.NAME, without_the_trainer(args, written, data))
    finish()


if __name__ == "__main__":
    main()
