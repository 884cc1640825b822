"""A classic DeepSpeed lab's translation fine-tune, on the HF Seq2SeqTrainer with DeepSpeed (ZeRO-2/3, CPU offload).

By default it trains a tiny T5 from scratch on the course's synthetic language pair (prepared by
``course_utils.rank.translation.prepare``); with ``--model_name t5-small --dataset_name wmt16`` it runs
that lab's real setup (needs the Hugging Face hub). BLEU (sacrebleu) is measured before training (rank 0, plain
transformers) and after every epoch (the Trainer's evaluation, eval_strategy="epoch"), with the seconds of each
evaluation and of every optimizer step, so that two runs (ZeRO-2, ZeRO-3) can be compared at the same step.

Run from a terminal:
  deepspeed --num_gpus 2 scripts/10_translation.py --data build/data/translation_4000_120_0_<language> \
      --epochs 7 --max_length 24 --output_dir build/translation --deepspeed_config configs/10_zero2_offload.json
"""
import os
import time
from pathlib import Path

import numpy as np
from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainer, Seq2SeqTrainingArguments, TrainerCallback

from course_utils.rank import translation as tr
from course_utils.common.record import record
from course_utils.common.records.translation import EngineSetup, Evaluation, Generation, build_parser
from course_utils.rank.scaffolding import finish, parse_args, rank0_print
from course_utils.rank.trainer import training_arguments


def engine_setup(engine) -> EngineSetup:
    return EngineSetup(stage=engine.zero_optimization_stage(), train_batch_size=engine.train_batch_size(),
                       optimizer=type(engine.basic_optimizer).__name__,
                       offload_param=bool(getattr(engine.optimizer, "offload_param", False)),
                       partitioned=any(hasattr(p, "ds_tensor") for p in engine.module.parameters()))


def model_and_data(args):
    """(tokenizer, model, {"train", "test"} splits): the lab's hub model and data, or the offline ones."""
    if args.model_name:                                    # the lab's setup: hub model and data (not run in CI)
        from datasets import load_dataset
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained(args.model_name)
        model = AutoModelForSeq2SeqLM.from_pretrained(args.model_name)
        raw = load_dataset(args.dataset_name, args.dataset_config)
        return tokenizer, model, {"train": raw["train"], "test": raw["validation"]}
    from datasets import load_from_disk
    from transformers import PreTrainedTokenizerFast
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(Path(args.data) / "tokenizer"))
    return tokenizer, tr.tiny_t5(tokenizer, seed=0), load_from_disk(str(Path(args.data) / "corpus"))


class StopEarly(TrainerCallback):
    """End training after ``epochs`` epochs or ``steps`` optimizer steps of a longer run (None: no limit): the
    learning-rate schedule is the full run's, so the steps taken are exactly the first steps of the full run."""

    def __init__(self, epochs: int | None = None, steps: int | None = None):
        self.epochs, self.steps = epochs, steps

    def on_step_end(self, args, state, control, **kwargs):
        if self.steps is not None and state.global_step >= self.steps:
            control.should_training_stop = True
        return control

    def on_epoch_end(self, args, state, control, **kwargs):
        if self.epochs is not None and state.epoch is not None and state.epoch >= self.epochs - 1e-9:
            control.should_training_stop = True
        return control


class Clock(TrainerCallback):
    """Seconds of every optimizer step (forward, backward and the optimizer's step; no evaluation inside) and,
    at each evaluation, an :class:`Evaluation` record: what a like-for-like comparison of two runs reads."""

    def __init__(self, examples: int):
        self.examples, self.step_seconds, self._started = examples, [], 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        self._started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.step_seconds.append(time.perf_counter() - self._started)

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        prefix = next(k[:-len("_bleu")] for k in metrics if k.endswith("_bleu"))
        record(Evaluation(epoch=round(state.epoch or 0.0, 4), step=state.global_step, bleu=metrics[f"{prefix}_bleu"],
                          seconds=metrics[f"{prefix}_runtime"], examples=self.examples))


# Other training splits whose batches per rank the ranks count (exercise 1 of notebook 10 predicts them too):
# (examples, per-device batch, ranks).
OTHER_SPLITS = [(1001, 25, 2), (230, 16, 3)]


def batches_per_rank(trainer, examples: int, batch: int, ranks: int) -> int:
    """How many batches each of ``ranks`` ranks gets from a training dataloader of ``examples`` examples at ``batch``
    per device, dealt out by accelerate with the settings of the Trainer's own accelerator (its ``split_batches`` and
    ``even_batches``, the Trainer's ``dataloader_drop_last``): with no accumulation, one epoch's optimizer steps."""
    from accelerate.data_loader import prepare_data_loader
    from torch.utils.data import DataLoader

    loader = DataLoader(range(examples), batch_size=batch, drop_last=trainer.args.dataloader_drop_last)
    return len(prepare_data_loader(loader, num_processes=ranks, process_index=0, put_on_device=False,
                                   split_batches=trainer.accelerator.split_batches,
                                   even_batches=trainer.accelerator.even_batches))


def first(split, n: int | None):
    """The first ``n`` examples of a split (all of them when ``n`` is None)."""
    return split.select(range(min(n, len(split)))) if n else split


def evaluation_split(eval_raw, world_size: int):
    """(examples, batch size per rank): evaluation generates one batch per rank, so the hand-off
    (notebook 10) can repeat exactly the same batches — greedy decoding of a padded batch depends, in
    its last bits, on the batch's padded length. The remainder of an uneven split is left out."""
    batch = tr.eval_batch_size(len(eval_raw), world_size)
    return eval_raw.select(range(batch * world_size)), batch


def main(argv=None) -> None:
    args = parse_args(build_parser(__doc__), argv)
    tokenizer, model, raw = model_and_data(args)
    train_raw = first(raw["train"], args.max_train_samples)
    eval_raw, eval_batch = evaluation_split(first(raw["test"], args.max_eval_samples),
                                            int(os.environ.get("WORLD_SIZE", 1)))

    def tokenize(batch):
        sources = [args.source_prefix + ex[args.source_lang] for ex in batch["translation"]]
        targets = [ex[args.target_lang] for ex in batch["translation"]]
        return tokenizer(sources, text_target=targets, max_length=args.max_length, truncation=True)

    train_set = train_raw.map(tokenize, batched=True, remove_columns=train_raw.column_names)
    eval_set = eval_raw.map(tokenize, batched=True, remove_columns=eval_raw.column_names)
    references = [ex[args.target_lang] for ex in eval_raw["translation"]]

    def compute_metrics(prediction):
        ids = np.where(prediction.predictions < 0, tokenizer.pad_token_id, prediction.predictions)
        texts = [t.strip() for t in tokenizer.batch_decode(ids, skip_special_tokens=True)]
        record("translations", texts)
        return {"bleu": tr.bleu(texts, references[:len(texts)])}

    if int(os.environ.get("RANK", 0)) == 0:
        # The Trainer's evaluate() before train() takes DeepSpeed's inference path, which accepts ZeRO-3 only
        # (and drops the optimizer from the config): so the untrained model is scored with plain transformers.
        sources = [args.source_prefix + ex[args.source_lang] for ex in eval_raw["translation"]]
        bleu_before = tr.bleu(tr.translate(model, tokenizer, sources, batch_size=eval_batch, max_length=args.max_length),
                              references)
        rank0_print(f"BLEU before training: {bleu_before:.2f}")
        record("bleu_before", bleu_before)
    targs = training_arguments(
        Seq2SeqTrainingArguments, output_dir=args.output_dir, deepspeed=args.deepspeed_config,
        per_device_train_batch_size=args.batch_size, per_device_eval_batch_size=eval_batch,
        num_train_epochs=args.epochs, learning_rate=args.learning_rate, warmup_steps=args.warmup_steps,
        weight_decay=0.0, max_grad_norm=1.0, logging_steps=args.logging_steps, save_strategy="no", eval_strategy="epoch",
        predict_with_generate=True, generation_max_length=args.max_length, generation_num_beams=1, seed=0)
    clock = Clock(len(eval_raw))
    trainer = Seq2SeqTrainer(model=model, args=targs, train_dataset=train_set, eval_dataset=eval_set,
                             data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
                             processing_class=tokenizer, compute_metrics=compute_metrics,
                             callbacks=[StopEarly(args.stop_after_epochs or None, args.stop_after_steps or None),
                                        clock])

    result = trainer.train()                 # evaluates (BLEU) at the end of every epoch: eval_strategy="epoch"
    record("loss", [[e["step"], e["loss"]] for e in trainer.state.log_history if "loss" in e])
    record("train_seconds", result.metrics["train_runtime"])      # the whole train(), evaluations included
    record("step_seconds", clock.step_seconds)
    record("steps", trainer.state.global_step)
    record("batches_per_rank", [[n, b, w, batches_per_rank(trainer, n, b, w)]
                                for n, b, w in [(len(train_set), args.batch_size, targs.world_size), *OTHER_SPLITS]])
    record(engine_setup(trainer.deepspeed))
    evaluated = [e for e in trainer.state.log_history if "eval_bleu" in e]
    if not evaluated or evaluated[-1]["step"] != trainer.state.global_step:    # stopped inside an epoch
        evaluated.append(trainer.evaluate())
    rank0_print(f"BLEU after training: {evaluated[-1]['eval_bleu']:.2f}")
    record("bleu_after", evaluated[-1]["eval_bleu"])
    trainer.deepspeed.save_checkpoint(str(Path(args.output_dir) / "checkpoint"))   # the ZeRO checkpoint, for zero_to_fp32
    trainer.save_model(str(Path(args.output_dir) / "model"))      # ZeRO-3: gathers (stage3_gather_16bit_weights_on_model_save)
    record("world_size", targs.world_size)
    record(Generation(batch_size=eval_batch, max_length=args.max_length, examples=len(eval_raw)))
    finish()


if __name__ == "__main__":
    main()
