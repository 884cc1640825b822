"""Ulysses sequence parallelism through the Hugging Face Trainer: the course's tiny Llama trained by ``Trainer`` with
ZeRO-3 and accelerate's ``ParallelismConfig(sp_backend="deepspeed", sp_size=...)``, one sample per step.

The Trainer hands ``TrainingArguments.parallelism_config`` to its ``Accelerator``; accelerate then registers DeepSpeed's
``UlyssesSPAttentionHF`` on the model and passes its groups (``mpu``) to ``deepspeed.initialize``
(``Accelerator._prepare_deepspeed``); the Trainer wraps its dataloader in ``UlyssesSPDataLoaderAdapter``
(``accelerator.deepspeed_ulysses_dl_adapter``) and computes the loss over the SP group
(``transformers.integrations.deepspeed.deepspeed_sp_compute_loss``). Records (``TrainerSpRun``): the losses and
gradient norms the Trainer logged, and which sample each rank's forward passes worked on.

The Trainer's sampler is sequential here: its default (``train_sampling_strategy="random"``) shuffles the samples
(accelerate's ``SeedableRandomSampler``, seeded by ``TrainingArguments.seed``), and the losses then belong to another
order than the one-process reference's (``course_utils.rank.long_context.reference``: samples 0, 1, 2, …).

Run from a terminal:  deepspeed --num_gpus 2 scripts/17_trainer_sp.py --seq_len 512 --steps 4 --sp_size 2
"""
import argparse
import json

import torch
from accelerate import ParallelismConfig
from accelerate.utils import DeepSpeedSequenceParallelConfig
from transformers import Trainer

from course_utils.common.record import record
from course_utils.common.records.long_context import CLIP, LR
from course_utils.common.records.long_context_trainer import TrainerSpRun
from course_utils.rank import long_context as lc
from course_utils.rank.scaffolding import finish, parse_args, rank0_print, scratch_dir
from course_utils.rank.trainer import training_arguments

# "auto" wherever the Trainer knows the value (notebook 08); no optimizer or scheduler section, so the Trainer builds
# torch's AdamW (the optimizer of the one-process reference) and a constant schedule, and ZeRO-3 wraps that optimizer;
# gradient_clipping comes from max_grad_norm, the reference's clipping
DEEPSPEED = {"zero_optimization": {"stage": 3}, "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
             "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "steps_per_print": 1_000_000}
SIZES = ("sp_backend", "sp_size", "dp_replicate_size", "dp_shard_size", "tp_size", "cp_size")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seq_len", type=int, default=512, help="tokens per sample")
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps, one sample each")
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument("--sp_size", type=int, default=2, help="ParallelismConfig(sp_backend='deepspeed', sp_size=...)")
    sizes.add_argument("--parallelism", default=None,
                       help="the keyword arguments of accelerate's ParallelismConfig as JSON (notebook 17's exercise)")
    parser.add_argument("--train_sampling_strategy", default="sequential", choices=["sequential", "random"],
                        help="the Trainer's sampler; 'random' (its default) shuffles the samples")
    return parser


class Samples(torch.utils.data.Dataset):
    """Samples 0 … count-1 of :func:`course_utils.rank.long_context.sample` (input_ids, labels, position_ids)."""

    def __init__(self, count: int, seq_len: int):
        self.count, self.seq_len = count, seq_len

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> dict:
        return lc.sample(index, self.seq_len)


def parallelism(args: argparse.Namespace) -> ParallelismConfig:
    """The ParallelismConfig of the launch. With sequence parallelism it carries accelerate's
    ``DeepSpeedSequenceParallelConfig``: accelerate passes its attention implementation to DeepSpeed's
    ``register_with_transformers``, which refuses one that differs from the model's (``sdpa``) — its default, None,
    included. The sequence length is fixed (every sample has ``--seq_len`` tokens)."""
    kwargs = json.loads(args.parallelism) if args.parallelism else {"sp_backend": "deepspeed", "sp_size": args.sp_size}
    if kwargs.get("sp_size", 1) > 1:
        kwargs.setdefault("sp_handler", DeepSpeedSequenceParallelConfig(
            sp_seq_length=args.seq_len, sp_seq_length_is_variable=False, sp_attn_implementation="sdpa"))
    return ParallelismConfig(**kwargs)


def watch_samples(model: torch.nn.Module, count: int, seq_len: int) -> list[int]:
    """A list that fills, forward by forward, with the sample this rank's slice of the sequence came from (found by
    its tokens: each sample's block of tokens is its own), -1 for a slice of no sample."""
    whole = [lc.sample(i, seq_len)["input_ids"] for i in range(count)]
    seen: list[int] = []

    def which(module, args, kwargs):
        ids = kwargs["input_ids"][0].cpu()
        n = ids.numel()
        seen.append(next((i for i, s in enumerate(whole)
                          if any(torch.equal(ids, s[k:k + n]) for k in range(0, seq_len - n + 1, n))), -1))

    model.register_forward_pre_hook(which, with_kwargs=True)
    return seen


def main(argv=None) -> None:
    args = parse_args(build_parser(), argv)
    model = lc.build()
    seen = watch_samples(model, args.steps, args.seq_len)
    targs = training_arguments(
        output_dir=scratch_dir(), deepspeed=DEEPSPEED, parallelism_config=parallelism(args),
        per_device_train_batch_size=1, gradient_accumulation_steps=1, max_steps=args.steps, learning_rate=LR,
        optim="adamw_torch", weight_decay=0.0, lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=CLIP,
        train_sampling_strategy=args.train_sampling_strategy, logging_steps=1, save_strategy="no")
    trainer = Trainer(model=model, args=targs, train_dataset=Samples(args.steps, args.seq_len))
    trainer.train()
    logged = [h for h in trainer.state.log_history if "loss" in h]
    pc = trainer.accelerator.parallelism_config
    record(TrainerSpRun(parallelism={k: getattr(pc, k) for k in SIZES}, samples=seen,
                        train_batch_size=trainer.model_wrapped.train_batch_size(),
                        losses=[h["loss"] for h in logged], grad_norms=[h.get("grad_norm") for h in logged]))
    rank0_print(f"Trainer losses: {[round(h['loss'], 4) for h in logged]}; samples this rank worked on: {seen}")
    finish()


if __name__ == "__main__":
    main()
