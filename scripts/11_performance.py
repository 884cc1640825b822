"""Where a step's time and memory go, on real ranks (notebook 11). Three parts, all of them unless ``--parts``
names some (the notebook launches the first alone, so that a learner's loop reruns in one short launch):

1. Gradient accumulation: the same effective batch as micro-batch × accumulation steps 8 × 1, 4 × 2 and 2 × 4 per
   rank, trained with plain SGD from the same weights on the same samples (of different lengths, padded), by the
   learner's loop or :func:`course_accumulate`; the loss of every optimizer step's samples before it. Then
   one optimizer step of 2 × 4 read micro-step by micro-step: is it a boundary, what ``engine.backward`` returned,
   did ``engine.step()`` change the weights. Last, the accumulation loops people write by hand around an engine
   (:data:`PITFALLS`), each from the same weights, and the update each made against updates computed by hand.
2. Activation memory: torch's memory tracker around one forward + backward pass of the ZeRO GPT-2 per sequence
   length and micro-batch, without and with activation checkpointing (transformers' and DeepSpeed's; CPU ranks count
   a share of the points each and exchange them); the step time each costs.
3. One engine with the config's flops profiler, ``wall_clock_breakdown``, comms logger and ``csv_monitor``, trained on
   sequences that count upward (a rule to learn: the loss it logs falls): every step's forward / backward / step
   times and collectives, the profiler's FLOPs per module, this rank's matmul peak, and all_reduce timings of
   several sizes (for an α–β model of the communication).

Run from a terminal:  deepspeed --num_gpus 2 scripts/11_performance.py --deepspeed_config configs/11_performance.json
"""
import argparse
import statistics
import time
import traceback
from pathlib import Path

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.accelerator import get_accelerator

from course_utils.common import run_folder
from course_utils.rank import comms, perf
from course_utils.rank.distributed import time_all_reduce
from course_utils.rank.memory import model_state_bytes, tensor_inventory
from course_utils.rank.models import count_parameters, preset, tiny_gpt2
from course_utils.common.record import record
from course_utils.common.records.perf import (SGD_LR, Activation, FlopsProfile, LoopUpdate, MicroStep, ModelStates, Recompute,
                                              StepTime, Trajectory, accumulation_config)
from course_utils.rank.scaffolding import finish, load_config, load_exercise, parse_args, rank0_print

ACCUMULATION = [(8, 1), (4, 2), (2, 4)]     # micro-batch per rank × accumulation steps: 8 samples per rank per step
AR_SIZES = [2 ** 10, 2 ** 14, 2 ** 18, 2 ** 20, 2 ** 22, 2 ** 24]    # all_reduce sizes (fp32 elements) for α–β


def weights(module) -> torch.Tensor:
    return torch.cat([p.detach().double().flatten() for p in module.parameters()])


def course_accumulate(engine, micro_batches: list) -> list[float]:
    """One optimizer step under gradient accumulation, as the ranks run it until the learner writes theirs (exercise
    1): every micro-batch gets a forward, ``engine.backward`` and ``engine.step()`` (which updates the weights only on
    the accumulation boundary). Each micro-batch's loss is the mean over the tokens it labels; weighted by its share of
    the step's labelled tokens, with the engine's own division by the accumulation steps switched off, the step
    trains on the mean over every labelled token, as one micro-batch of them all would. Returns each micro-batch's loss."""
    tokens = [int((b["labels"] != -100).sum()) for b in micro_batches]
    losses = []
    for batch, n in zip(micro_batches, tokens):
        loss = engine(**batch).loss
        engine.backward(loss * n / sum(tokens), scale_wrt_gas=False)
        engine.step()
        losses.append(loss.item())
    return losses


def step_loss(module, micro_batches: list) -> float:
    """The loss of one optimizer step's samples at the current weights: the mean over every token they label, as one
    micro-batch of them all gives it (no gradient; the same for every accumulation setting)."""
    with torch.no_grad():
        return module(**{k: torch.cat([b[k] for b in micro_batches]) for k in ("input_ids", "labels")}).loss.item()


def returned_what(value, micro_batches: int) -> str:
    """"" when a loop returned what exercise 1 asks (a list of one Python float per micro-batch), else what it did."""
    if not isinstance(value, list):
        return f"a {type(value).__name__}, not a list"
    if len(value) != micro_batches:
        return f"a list of {len(value)} values for {micro_batches} micro-batches"
    odd = next((v for v in value if not isinstance(v, float)), None)
    return "" if odd is None else f"a list holding a {type(odd).__name__}, not Python floats"


def run_accumulation(base: dict, steps: int, loop, loop_name: str, device: str) -> None:
    """Every setting of :data:`ACCUMULATION` with ``loop``; with the learner's loop, then 8 × 1 once more with the
    course's, from the same weights on the same samples: the reference a loop that is wrong in every setting alike
    (no step, or every update scaled) cannot match."""
    rank, world = dist.get_rank(), dist.get_world_size()
    settings = [(micro, gas, loop, loop_name) for micro, gas in ACCUMULATION]
    if loop_name != "course":
        settings.append((*ACCUMULATION[0], course_accumulate, "course"))
    for micro, gas, run_loop, name in settings:
        engine, *_ = deepspeed.initialize(model=tiny_gpt2("checkpoints"), config=accumulation_config(base, micro, gas))
        run = Trajectory(micro, gas, engine.train_batch_size(), name)
        for step in range(steps):
            batches = [{k: v.to(device) for k, v in b.items()} for b in perf.micro_batches(step, rank, world, micro, gas)]
            mean = torch.tensor(step_loss(engine.module, batches), dtype=torch.float64).to(device)
            run.returned = run.returned or returned_what(run_loop(engine, batches), len(batches))
            dist.all_reduce(mean)
            run.loss.append(mean.item() / world)
        run.weight_sum = weights(engine.module).sum().item()
        record(run)
        rank0_print(f"{micro} × {gas}{' (the course loop)' if name != loop_name else ''}: "
                    f"loss {run.loss[0]:.4f} → {run.loss[-1]:.4f}")
    # one optimizer step of 2 × 4, micro-step by micro-step, with DeepSpeed's plain loop written out
    micro, gas = ACCUMULATION[-1]
    engine, *_ = deepspeed.initialize(model=tiny_gpt2("checkpoints"), config=accumulation_config(base, micro, gas))
    for i, batch in enumerate(perf.micro_batches(0, rank, world, micro, gas)):
        batch = {k: v.to(device) for k, v in batch.items()}
        boundary = engine.is_gradient_accumulation_boundary()
        loss = engine(**batch).loss
        returned = engine.backward(loss)
        before = weights(engine.module)
        engine.step()                       # counts the micro-step; updates on the boundary only
        record(MicroStep(i, boundary, (returned / loss).item(), not torch.equal(before, weights(engine.module)),
                         engine.global_steps))


# Accumulation loops written by hand around an engine (section 1's pitfall). Each gets micro-batch i (from 0) of a run.
def ported(engine, optimizer, gas, i, batch):       # a plain PyTorch accumulation loop, the engine put in for the model
    loss = engine(**batch).loss / gas
    engine.backward(loss)
    if (i + 1) % gas == 0:
        optimizer.step()
        optimizer.zero_grad()


def divides(engine, optimizer, gas, i, batch):      # engine.step() every micro-batch, but the loss still divided
    loss = engine(**batch).loss / gas
    engine.backward(loss)
    engine.step()


def steps_every_gas(engine, optimizer, gas, i, batch):    # no division, but engine.step() where optimizer.step() was
    loss = engine(**batch).loss
    engine.backward(loss)
    if (i + 1) % gas == 0:
        engine.step()


def zeroes(engine, optimizer, gas, i, batch):       # right, but optimizer.zero_grad() first, as plain PyTorch loops do
    optimizer.zero_grad()
    loss = engine(**batch).loss
    engine.backward(loss)
    engine.step()


def engines_own(engine, optimizer, gas, i, batch):  # DeepSpeed's loop: the engine divides, counts and steps
    loss = engine(**batch).loss
    engine.backward(loss)
    engine.step()


PITFALLS = {"ported": (ported, 1), "divides": (divides, 1), "steps_every_gas": (steps_every_gas, 4),
            "zeroes": (zeroes, 1), "engines_own": (engines_own, 1)}      # loop, optimizer steps' worth of micro-batches


def run_accumulation_pitfalls(base: dict, device: str) -> None:
    """Every loop of :data:`PITFALLS` from the same initial weights on the micro-batches of 2 × 4, with gradient
    clipping off (an update is then the gradient times the learning rate), against two updates computed by hand from
    the micro-batches it ran: plain SGD on the mean of their gradients, and on the last one's alone."""
    rank, world = dist.get_rank(), dist.get_world_size()
    micro, gas = ACCUMULATION[-1]
    batches = [{k: v.to(device) for k, v in b.items()}
               for step in range(gas) for b in perf.micro_batches(step, rank, world, micro, gas)]
    grads = perf.hand_gradients(tiny_gpt2("checkpoints").to(device), batches)
    config = accumulation_config(base, micro, gas)      # gradient clipping off, as in every accumulation engine
    for name, (loop, steps) in PITFALLS.items():
        engine, optimizer, *_ = deepspeed.initialize(model=tiny_gpt2("checkpoints"), config=config)
        start = weights(engine.module)
        changed, error, before = [], "", start
        try:
            for i, batch in enumerate(batches[:steps * gas]):
                loop(engine, optimizer, gas, i, batch)
                after = weights(engine.module)
                if not torch.equal(before, after):
                    changed.append(i + 1)
                before = after
        except Exception:
            error = traceback.format_exc()      # what the learner's launch would print, and end with
        update, ran = weights(engine.module) - start, grads[:steps * gas]
        by_hand = {"mean": -SGD_LR * sum(ran) / len(ran), "last": -SGD_LR * ran[-1]}
        record(LoopUpdate(name, len(ran), changed, engine.global_steps, type(optimizer).__name__,
                          {k: perf.fit(update, u) for k, u in by_hand.items()}, error))


def run_activations(base: dict, seq_lens: list[int], batches: list[int], hidden: tuple[int, int], device: str,
                    repeats: int, timed: list[str], time_at: tuple[int, int] | None) -> None:
    model = tiny_gpt2("zero_lab").to(device)
    model.config.use_cache = False
    vocab = preset("zero_lab").vocab_size
    points = [(s, b) for s in seq_lens for b in batches] + [hidden]
    # Every rank holds the same model and builds the same inputs, so the bytes counted are the same on any rank. CPU
    # ranks share the machine's cores: each counts its share of the points, and the ranks exchange what they counted.
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.get_backend() == "gloo" else (0, 1)
    counted = {}
    for how in ("off", "hf", "deepspeed"):          # deepspeed.checkpointing at every point but exercise 2's
        perf.set_checkpointing(model, how, base)
        for i, (seq, batch) in enumerate(points if how != "deepspeed" else points[:-1]):
            if i % world != rank:
                continue
            ids = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seq * 100 + batch))
            m = perf.activation_memory(model, ids.to(device))
            counted[how, seq, batch] = Activation(how, seq, batch, m.after_forward["Activation"], m.peak["Total"], m.peak)
    if world > 1:
        shares = [None] * world
        dist.all_gather_object(shares, counted)
        counted = {k: a for share in shares for k, a in share.items()}
    for how in ("off", "hf", "deepspeed"):          # every rank records them all, in the order of the points
        for seq, batch in points:
            if (how, seq, batch) in counted:
                record(counted[how, seq, batch])
    seq, batch = time_at or (max(seq_lens), max(batches))
    ids = torch.randint(0, vocab, (batch, seq)).to(device)
    passes = perf.interleaved_passes(model, ids, timed, repeats, base)
    seconds = {how: statistics.median(f + b for f, b in zip(p["forward"], p["backward"])) for how, p in passes.items()}
    record(Recompute(seq, batch, seconds, passes))
    rank0_print(f"activations of {batch} × {seq} tokens measured; a pass takes {seconds['off']:.2f} s, "
                f"{seconds['hf']:.2f} s with checkpointing")


def profiled_config(base: dict, run_dir: str) -> dict:
    """The config with its profiler's output file and the monitor's folder in this launch's run folder."""
    cfg = comms.with_comms_logger(base)
    cfg["flops_profiler"]["output_file"] = str(Path(run_dir, "flops_profile.txt"))
    cfg["csv_monitor"]["output_path"] = str(Path(run_dir, "monitor"))
    return cfg


def run_profiled(base: dict, steps: int, seq_len: int, device: str, ar_repeats: int) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    run_dir = str(run_folder.here())
    config = profiled_config(base, run_dir)
    model = tiny_gpt2("zero_lab")
    model.config.use_cache = False
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    micro, profile_step = engine.train_micro_batch_size_per_gpu(), config["flops_profiler"]["profile_step"]
    for step in range(steps):
        ids = perf.counting_batch(step, rank, micro, seq_len).to(device)      # learnable: the logged loss falls
        profiling = engine.global_steps == profile_step and rank == 0
        with comms.logged() as window:
            started = time.perf_counter()
            loss = engine(input_ids=ids, labels=ids).loss
            if profiling:     # the profiler's per-module counts live until engine.step() ends the profile
                modules = perf.module_rows(engine.module)
                fwd_flops = engine.flops_profiler.get_total_flops()
            engine.backward(loss)
            engine.step()
            wall_ms = 1e3 * (time.perf_counter() - started)
        engine.monitor.write_events([("Train/Samples/train_loss", loss.item(), engine.global_samples)])
        record(StepTime(step, wall_ms, dict(engine.get_wall_clock_timers()), window.timed, loss.item()))
        if profiling:
            record(FlopsProfile(profile_step, micro, seq_len, int(fwd_flops), count_parameters(engine.module),
                                modules, perf.matmul_flops_per_s(device), config["flops_profiler"]["output_file"]))
    stage = engine.zero_optimization_stage()
    record(ModelStates(stage, world, model_state_bytes(tensor_inventory(engine))))
    for row in time_all_reduce(AR_SIZES, device, repeats=ar_repeats):
        record(row)
    rank0_print(f"{steps} profiled steps; all_reduce timed at {len(AR_SIZES)} sizes")


PARTS = ("accumulation", "activations", "profiled")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--accumulation_steps", type=int, default=6, help="optimizer steps per accumulation setting")
    parser.add_argument("--accumulate_file", default=None, help="file defining accumulate() (exercise 1)")
    parser.add_argument("--seq_lens", type=int, nargs="+", default=[32, 64, 128])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--hidden", type=int, nargs=2, default=[96, 3], help="a point measured for exercise 2")
    parser.add_argument("--repeats", type=int, default=4, help="timed passes per checkpointing setting (interleaved)")
    parser.add_argument("--timed", nargs="+", default=["off", "hf", "deepspeed"], help="checkpointing settings to time")
    parser.add_argument("--time_at", type=int, nargs=2, default=None,
                        help="sequence length and batch of the timed passes (default: the largest)")
    parser.add_argument("--steps", type=int, default=6, help="steps of the profiled engine")
    parser.add_argument("--seq_len", type=int, default=64, help="tokens per sample of the profiled engine")
    parser.add_argument("--ar_repeats", type=int, default=5)
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS),
                        help="what to run (a machine with one GPU runs the activations on it, the rest on 2 CPU ranks)")
    return parser


def main(argv=None) -> None:
    args = parse_args(build_parser(), argv)
    base = load_config(args)
    deepspeed.init_distributed()
    device = get_accelerator().current_device_name()

    loop, loop_name = course_accumulate, "course"
    if args.accumulate_file:
        loop, loop_name = load_exercise(args.accumulate_file, ["accumulate"])["accumulate"], "yours"
    if "accumulation" in args.parts:
        run_accumulation(base, args.accumulation_steps, loop, loop_name, device)
        run_accumulation_pitfalls(base, device)
    if "activations" in args.parts:
        run_activations(base, args.seq_lens, args.batches, tuple(args.hidden), device, args.repeats, args.timed,
                        tuple(args.time_at) if args.time_at else None)
    if "profiled" in args.parts:
        run_profiled(base, args.steps, args.seq_len, device, args.ar_repeats)
    finish()


if __name__ == "__main__":
    main()
