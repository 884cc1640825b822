"""Notebook 10's records: the translation capstone (``scripts/10_translation.py``): evaluations, generation, the
engine; and the script's command line, which the notebook reads its defaults from."""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from course_utils.common.record import Record

SOURCE_LANG, TARGET_LANG = "src", "tgt"     # the keys of a translation pair in the course's corpus


@dataclass
class Generation(Record, name="generation"):
    """How the ranks generated their evaluation translations, so the hand-off can repeat it exactly."""
    batch_size: int               # examples per rank: one evaluation batch each
    max_length: int               # the bound on the whole output (generation_max_length)
    examples: int                 # evaluation examples translated (a multiple of the world size)


@dataclass
class Evaluation(Record, name="evaluation"):
    """One evaluation of the model during or after training: BLEU and how long generating the translations took."""
    epoch: float                  # the Trainer's epoch counter when it evaluated (1.0 = after the first epoch)
    step: int                     # optimizer steps taken by then
    bleu: float                   # corpus BLEU (sacrebleu) of the greedy translations of the evaluation examples
    seconds: float                # the Trainer's evaluation runtime: generation on every rank, then BLEU
    examples: int                 # evaluation examples (over every rank)


@dataclass
class EngineSetup(Record, name="engine_setup"):
    """What the DeepSpeed engine inside the Trainer was built with, read from the engine itself."""
    stage: int                    # engine.zero_optimization_stage()
    train_batch_size: int         # examples per optimizer step, over every rank
    optimizer: str                # the class that runs the step (DeepSpeedCPUAdam when the optimizer is offloaded)
    offload_param: bool           # ZeRO-3's optimizer keeps the parameter partitions on the host between uses
    partitioned: bool             # the module's weights are ZeRO-3 shards (ds_tensor), not whole tensors


def build_parser(description: str | None = None) -> argparse.ArgumentParser:
    """The command line of ``scripts/10_translation.py`` (``description``: its help text)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--data", help="folder from translation.prepare (corpus/ and tokenizer/); the offline default")
    parser.add_argument("--model_name", default=None, help="a hub model, e.g. t5-small (default: a tiny T5 from a config)")
    parser.add_argument("--dataset_name", default=None, help="a hub data set, e.g. wmt16 (with --dataset_config ro-en)")
    parser.add_argument("--dataset_config", default="ro-en")
    parser.add_argument("--source_lang", default=SOURCE_LANG)
    parser.add_argument("--target_lang", default=TARGET_LANG)
    parser.add_argument("--source_prefix", default="", help='e.g. "translate English to Romanian: " for t5-small')
    parser.add_argument("--max_train_samples", type=int, default=None)
    parser.add_argument("--max_eval_samples", type=int, default=None)
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--stop_after_epochs", type=int, default=None,
                        help="end training after this many of the --epochs (the schedule stays that of the whole run)")
    parser.add_argument("--stop_after_steps", type=int, default=None,
                        help="end training after this many optimizer steps (the schedule stays that of the whole run)")
    parser.add_argument("--logging_steps", type=int, default=20, help="log the training loss every this many steps")
    parser.add_argument("--batch_size", type=int, default=32, help="per device")
    parser.add_argument("--learning_rate", type=float, default=3e-3)
    parser.add_argument("--warmup_steps", type=int, default=30)
    parser.add_argument("--max_length", type=int, default=64)
    return parser


@dataclass
class GenerateRun(Record, name="generate_run"):
    """One ``generate`` call of ``scripts/10_generate_zero3.py`` on one rank, under ZeRO-3 without the Trainer."""
    round: int                    # 1: synced_gpus=True; 2: as the script's option says (None: transformers decides)
    synced_gpus: bool | None      # what the script passed to generate (None: the argument left out)
    forward_calls: int            # calls of the model's forward during this generate (one per generated token)
    lengths: list                 # tokens of each output (</s> included, padding excluded)
    sentences: list               # the sources this rank translated
    translations: list            # and its translations
    registered: dict              # is_deepspeed_zero3_enabled() at three moments (what generate's default reads)
    partitioned: bool             # every parameter of the module is a ZeRO-3 shard with nothing held whole
    world_size: int
