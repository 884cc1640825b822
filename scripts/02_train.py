"""A common tutorial's BERT emotion classifier, trained with a DeepSpeed engine on every rank: each rank
trains and evaluates on its own shard, each step's loss is averaged over the ranks for logging, predictions
are all_gathered for one classification report, and the checkpoint is reloaded into a fresh engine.

With --tutorial_loop it reproduces that tutorial's loop instead: no DistributedSampler, so every rank
trains on the same batches and evaluates every example.

Run from a terminal:
  deepspeed --num_gpus 2 scripts/02_train.py --deepspeed_config configs/02_emotion.json
"""
import argparse
import os
import time
from contextlib import contextmanager
from typing import Iterator

import deepspeed
import torch
import torch.distributed as dist
import torch.nn.functional as F
from deepspeed.accelerator import get_accelerator
from torch.utils.data import DataLoader, DistributedSampler, StackDataset

from course_utils.common import run_folder
from course_utils.rank import data
from course_utils.rank.models import count_parameters
from course_utils.common.record import record
from course_utils.common.records.training import TrainLoss
from course_utils.rank.scaffolding import finish, load_exercise, parse_args, rank0_print, seed_everything


def shard_loader(dataset, batch_size: int, rank: int, world_size: int, shuffle: bool = False, seed: int = 0):
    """A DataLoader over this rank's shard: ``DistributedSampler`` hands each rank every world_size-th example
    (padding the last round by repeating examples, so every rank gets the same number of batches and collectives stay
    in step). Call ``loader.sampler.set_epoch(e)`` each epoch when shuffling."""
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler)


def gather_predictions(indices, preds, labels):
    """All-gather every rank's (example index, prediction, label) and keep each example once.

    A ``DistributedSampler`` pads the last round by repeating examples so every rank has the same number; the indices
    tell the repeats apart. Returns (indices, preds, labels) sorted by index, identical on every rank."""
    local = torch.stack([indices, preds, labels])             # 3 × n: one all_gather instead of three
    gathered = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, local)
    every = torch.cat(gathered, dim=1)
    unique, position = torch.unique(every[0], return_inverse=True)
    kept = torch.empty(3, unique.numel(), dtype=every.dtype, device=every.device)
    kept[:, position] = every                                 # repeats carry the same values
    return kept[0], kept[1], kept[2]


def mean_over_ranks(value: torch.Tensor) -> float:
    """The loss every rank computed on its own batch, averaged over ranks (for logging only)."""
    total = value.detach().clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return (total / dist.get_world_size()).item()


def train_step(engine, batch, device) -> float:
    """One training step on this rank's batch through the DeepSpeed engine; returns the batch loss averaged
    over the ranks (for logging)."""
    out = engine(input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device),
                 labels=batch["label"].to(device))
    engine.backward(out.loss)          # gradients, averaged across ranks
    engine.step()                      # optimizer step (+ clipping, scheduler, zero_grad)
    return mean_over_ranks(out.loss)


def learner_functions(files) -> dict:
    """shard_loader, gather_predictions and train_step: the course's (above), replaced by the notebook's exercise
    functions where the files define them (checks.export_function wrote them)."""
    found = {"shard_loader": shard_loader, "gather_predictions": gather_predictions, "train_step": train_step}
    for path in files:
        found.update(load_exercise(path, list(found)))
    return found


def tutorial_gather(indices, preds, labels):
    """The tutorial's output_reduce: all_gather and concatenate, nothing removed."""
    out = []
    for t in (indices, preds, labels):
        parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, t)
        out.append(torch.cat(parts))
    return out


def evaluate(engine, loader, gather, device):
    """Predict this rank's batches, gather every rank's, return (indices, preds, labels) on all ranks."""
    engine.eval()
    idx, preds, labels = [], [], []
    with torch.no_grad():
        for batch in loader:
            logits = engine(input_ids=batch["input_ids"].to(device),
                            attention_mask=batch["attention_mask"].to(device)).logits
            idx.append(batch["idx"].to(device))
            preds.append(logits.argmax(-1))
            labels.append(batch["label"].to(device))
    engine.train()
    return gather(torch.cat(idx), torch.cat(preds), torch.cat(labels))


@contextmanager
def watching_logits(model: torch.nn.Module) -> Iterator[dict]:
    """A dict that a forward hook fills with the logits of ``model``'s latest forward (a copy): the script's own
    measure of the loss each rank trained on, whatever a learner's ``train_step`` computes or returns."""
    seen: dict = {}
    hook = model.register_forward_hook(lambda module, inputs, output: seen.update(logits=output.logits.detach().clone()))
    try:
        yield seen
    finally:
        hook.remove()


def own_loss(seen: dict, batch, device) -> float:
    """This rank's loss on its own batch, from the logits the step's forward produced (the loss that
    BertForSequenceClassification computes for integer labels: cross-entropy, averaged over the batch)."""
    if "logits" not in seen:
        raise RuntimeError("train_step ran no forward through the engine: call engine(input_ids=..., "
                           "attention_mask=..., labels=...) on the batch")
    return F.cross_entropy(seen.pop("logits").float(), batch["label"].to(device)).item()


def prepare_data(args, rank: int):
    """The vocabulary size and the tokenized emotion splits: rank 0 generates the data set, trains the tokenizer and
    tokenizes once (:func:`course_utils.rank.data.cached_emotion_tokens`, cached under build/data), the others wait
    and load the token ids it saved."""
    if rank != 0:
        dist.barrier()                    # rank 0 makes the data, tokenizer and token ids once ...
    tokens = data.cached_emotion_tokens(args.train_size, args.eval_size, args.vocab_size, args.max_length)
    if rank == 0:
        dist.barrier()                    # ... the others load them from the cache
    return tokens["vocabulary"], *(StackDataset(**tokens[s]) for s in ("train", "eval"))


def train(args, engine, train_loader, device, train_step) -> int:
    """Train ``--epochs`` epochs (or ``--max_steps`` steps), one ``train_step`` per batch; returns the number of
    steps taken. Every step records this rank's own batch loss (measured here) beside what ``train_step``
    returned, so the notebook can check a learner's step against what the ranks measured."""
    step = 0
    handed: list = []                 # the value of each loss train_step hands to engine.backward
    backward = engine.backward

    def watched_backward(loss, *rest, **kwargs):
        handed.append(float(loss.detach().float()))
        return backward(loss, *rest, **kwargs)

    engine.backward = watched_backward
    with watching_logits(engine.module) as logits:
        for epoch in range(args.epochs):
            if hasattr(train_loader.sampler, "set_epoch"):
                train_loader.sampler.set_epoch(epoch)     # a new shuffle each epoch, the same on every rank
            for batch in train_loader:
                if step == 0:
                    record("first_batch", batch["idx"][:8])   # which examples this rank trains on first
                before = len(handed)
                mean = train_step(engine, batch, device)
                step += 1
                own = own_loss(logits, batch, device)
                record(TrainLoss(step=step, own=own, mean=float(mean),
                                 backward=handed[-1] if len(handed) == before + 1 else None))
                if step == args.max_steps:
                    return step
    return step


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--train_size", type=int, default=6000)
    parser.add_argument("--eval_size", type=int, default=999)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--max_steps", type=int, default=0, help="stop training after this many steps (0: no limit)")
    parser.add_argument("--max_length", type=int, default=32, help="tokens per example (padded/truncated)")
    parser.add_argument("--vocab_size", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--tutorial_loop", action="store_true", help="the tutorial's loop: no DistributedSampler")
    parser.add_argument("--functions", nargs="*", default=[],
                        help="files defining shard_loader, gather_predictions and/or train_step, used instead of the course's")
    parser.add_argument("--output_dir", default=None, help="where the checkpoint goes (default: the run folder's checkpoint/)")
    return parser


def main(argv=None) -> None:
    args = parse_args(build_parser(), argv)
    deepspeed.init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    device = get_accelerator().device_name(args.local_rank)
    fns = learner_functions(args.functions)
    vocabulary, train_set, eval_set = prepare_data(args, rank)

    seed_everything(args.seed)
    model = data.emotion_classifier(vocabulary, seed=args.seed)
    engine, _, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())
    batch_size = engine.train_micro_batch_size_per_gpu()
    record("batch_sizes", {"micro": batch_size, "accumulation": engine.gradient_accumulation_steps(),
                           "global": engine.train_batch_size()})   # what DeepSpeed made of the config
    rank0_print(f"{count_parameters(model):,} parameters, vocabulary {vocabulary}, {len(train_set)} train / "
                f"{len(eval_set)} eval examples, micro batch {batch_size} per rank × {world} ranks")

    if args.tutorial_loop:                 # the tutorial: a plain DataLoader on every rank
        train_loader = DataLoader(train_set, batch_size=batch_size, shuffle=True,
                                  generator=torch.Generator().manual_seed(args.seed))
        eval_loader = DataLoader(eval_set, batch_size=batch_size)
        gather = tutorial_gather
    else:
        train_loader = fns["shard_loader"](train_set, batch_size, rank, world, shuffle=True, seed=args.seed)
        eval_loader = fns["shard_loader"](eval_set, batch_size, rank, world)
        gather = fns["gather_predictions"]
    record("train_batches_per_epoch", len(train_loader))

    started = time.perf_counter()
    step = train(args, engine, train_loader, device, fns["train_step"])
    train_seconds = time.perf_counter() - started
    idx, preds, labels = evaluate(engine, eval_loader, gather, device)
    truth = {int(example["idx"]): int(example["label"]) for example in eval_set}
    aligned = idx.numel() == preds.numel() == labels.numel() and \
        all(truth.get(i) == y for i, y in zip(idx.tolist(), labels.tolist()))   # each label still beside its index
    accuracy = (preds == labels).float().mean().item() if preds.numel() == labels.numel() else float("nan")
    rank0_print(f"trained {step} steps in {train_seconds:.1f} s; evaluation: {idx.numel()} predictions gathered "
                f"for {len(eval_set)} examples, accuracy {accuracy:.4f}")
    classes = len(data.EMOTION_LABELS)
    if rank == 0:
        report = data.classification_report(labels.cpu(), preds.cpu(), data.EMOTION_LABELS)
        print(report)
        record("report", report)
        record("eval_unique_examples", int(torch.unique(idx).numel()))
        record("eval_examples", idx.numel())
        record("eval_columns", {"indices": idx.numel(), "predictions": preds.numel(), "labels": labels.numel(),
                                "labels_at_their_indices": aligned})
        record("eval_examples_expected", len(eval_set))
        record("eval_accuracy", accuracy)
        confusion = torch.bincount((labels * classes + preds).long().cpu(), minlength=classes * classes)
        record("eval_confusion", confusion.view(classes, classes).tolist())   # row: the true label, column: predicted
        record("train_steps", step)
        record("train_seconds", train_seconds)
        record("device", device)

    if not args.tutorial_loop:
        args.output_dir = args.output_dir or str(run_folder.here() / "checkpoint")
        engine.save_checkpoint(args.output_dir, tag="final")
        fresh = data.emotion_classifier(vocabulary, seed=args.seed + 1)   # different random weights on purpose
        reloaded, _, _, _ = deepspeed.initialize(args=args, model=fresh, model_parameters=fresh.parameters())
        before = evaluate(reloaded, eval_loader, gather, device)
        reloaded.load_checkpoint(args.output_dir, tag="final", load_module_only=True)
        _, again, _ = evaluate(reloaded, eval_loader, gather, device)
        if rank == 0:
            record("fresh_accuracy", (before[1] == before[2]).float().mean().item())
            # what the fresh engine predicted, against the labels' shares
            record("fresh_predicted_counts", torch.bincount(before[1].long().cpu(), minlength=classes).tolist())
            record("eval_label_counts", torch.bincount(before[2].long().cpu(), minlength=classes).tolist())
            record("reload_accuracy", (again == labels).float().mean().item())
            record("reload_same_predictions", bool(torch.equal(again, preds)))
            record("checkpoint_files", sorted(os.listdir(os.path.join(args.output_dir, "final"))))
    finish()


if __name__ == "__main__":
    main()
