"""Notebook 11's tables and figures, read from what ``scripts/11_performance.py`` and ``scripts/11_hang.py``
recorded: the same updates under gradient accumulation, activation memory, the flops profiler and MFU, where a
step's time goes (with an α–β model of the all-reduce), the monitor's CSV files, and where each rank hung."""
from __future__ import annotations

import csv
import re
import statistics
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from course_utils.common.record import read_as
from course_utils.common.records.perf import Activation, FlopsProfile, LoopUpdate, Recompute, StepTime, Trajectory

if TYPE_CHECKING:
    from course_utils.kernel.launch.result import LaunchResult


# ---------------------------------------------------------------- 1 · accumulation

def given_trajectories(records: list[dict]) -> list[Trajectory]:
    """Rank 0's settings of the loop the ranks were given (the first one recorded: the learner's, or the course's until
    exercise 1 is written), without the course loop's reference run (:func:`reference_gap`)."""
    trajectories = read_as(records, Trajectory)
    return [t for t in trajectories if t.loop == trajectories[0].loop]


def loss_table(records: list[dict]) -> dict[str, list[float]]:
    """The loss per optimizer step for each micro-batch × accumulation setting of the given loop, "8 × 1" → losses."""
    return {f"{t.micro} × {t.gas}": t.loss for t in given_trajectories(records)}


def reference_gap(records: list[dict]) -> float | None:
    """The largest difference, over the steps, between the given loop's first setting (8 × 1) and the course loop's
    run of that setting from the same weights on the same samples; None when the ranks ran the course's loop only."""
    trajectories = read_as(records, Trajectory)
    yours = trajectories[0]
    course = next((t for t in trajectories[1:] if t.loop == "course" != yours.loop
                   and (t.micro, t.gas) == (yours.micro, yours.gas)), None)
    return None if course is None else max(abs(a - b) for a, b in zip(yours.loss, course.loss))


def returned(records: list[dict]) -> str:
    """What the given loop returned where it was not a list of one float per micro-batch ("" when it always was)."""
    return next((t.returned for t in given_trajectories(records) if t.returned), "")


def max_abs_loss_diff(losses: dict[str, list[float]]) -> float:
    """The largest difference between any setting's loss and the first setting's, over every step."""
    first, *others = losses.values()
    return max(abs(a - b) for other in others for a, b in zip(first, other))


def loop_rows(records: list[dict]) -> list[dict[str, Any]]:
    """Rank 0's hand-written accumulation loops (``LoopUpdate``), one row each: which micro-batches changed the
    weights, the engine's step count, the update as a multiple of two updates computed by hand from the micro-batches
    the loop ran (plain SGD on the mean of their gradients, on the last one's alone) with what the multiple leaves
    over, and the last line of the error, where the loop raised."""
    return [{"loop": u.loop, "micro-batches": u.micro_batches,
             "weights changed by micro-batch": ", ".join(map(str, u.changed_after)) or "none",
             "global_steps": u.global_steps,
             "update ÷ mean's": round(u.fits["mean"][0], 6), "left over (mean)": u.fits["mean"][1],
             "update ÷ last's": round(u.fits["last"][0], 6), "left over (last)": u.fits["last"][1],
             "raised": u.error.strip().splitlines()[-1] if u.error else ""}
            for u in read_as(records, LoopUpdate)]


def is_multiple(fit: list[float], factor: float, tolerance: float) -> bool:
    """Whether an update is ``factor`` × a by-hand update, to ``tolerance`` (``fit`` is one of ``LoopUpdate.fits``:
    [factor, left over])."""
    return abs(fit[0] - factor) <= tolerance and fit[1] <= tolerance


# ---------------------------------------------------------------- 2 · activations

def activation_rows(records: list[dict], hidden: tuple[int, int] | None = None) -> list[dict[str, Any]]:
    """Rank 0's activation measurements (MiB), without the point ``hidden`` (exercise 2's)."""
    rows = []
    for a in read_as(records, Activation):
        if hidden and (a.seq_len, a.batch) == tuple(hidden):
            continue
        rows.append({"checkpointing": a.checkpointing, "seq_len": a.seq_len, "batch": a.batch,
                     "tokens": a.seq_len * a.batch, "activations after forward (MiB)": a.after_forward / 2 ** 20,
                     "peak of the pass (MiB)": a.peak_total / 2 ** 20})
    return rows


def measured_activation(records: list[dict], checkpointing: str, seq_len: int, batch: int) -> int:
    """Activation bytes after the forward pass that rank 0 measured for one setting."""
    found = [a.after_forward for a in read_as(records, Activation)
             if (a.checkpointing, a.seq_len, a.batch) == (checkpointing, seq_len, batch)]
    if not found:
        raise LookupError(f"no measurement of sequence length {seq_len} × micro-batch {batch} ({checkpointing}) here")
    return found[0]


@contextmanager
def withheld(records: list[dict], seq_len: int, batch: int) -> Iterator[None]:
    """Inside the block, ``records`` (a launch's, changed in place) lack the activation measurements of one setting:
    exercise 2's prediction is made while its measurement is out of reach, then the records are whole again."""
    kept = list(records)
    records[:] = [r for r in records if not (r.get("name") == Activation.NAME
                                             and (r["value"].get("seq_len"), r["value"].get("batch")) == (seq_len, batch))]
    try:
        yield
    finally:
        records[:] = kept


def recompute_rows(records: list[dict]) -> list[dict[str, Any]]:
    """Rank 0's interleaved passes per checkpointing setting: min / median / max of the whole pass, median
    forward and backward (ms), and the median page faults of a pass."""
    recompute = read_as(records, Recompute)[0]
    rows = []
    for how, p in recompute.passes.items():
        total = [1e3 * (f + b) for f, b in zip(p["forward"], p["backward"])]
        rows.append({"checkpointing": how, "passes": len(total), "min ms": min(total),
                     "median ms": statistics.median(total), "max ms": max(total),
                     "forward ms (median)": 1e3 * statistics.median(p["forward"]),
                     "backward ms (median)": 1e3 * statistics.median(p["backward"]),
                     "page faults per pass (median)": statistics.median(p["minor_faults"])})
    return rows


def plot_activations(rows: list[dict], model_states_bytes: int, world_size: int):
    """Activation memory against tokens per micro-batch, without and with checkpointing, beside the model states
    a rank holds (the profiled ZeRO-1 engine)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for how, style in (("off", "o-"), ("hf", "s-"), ("deepspeed", "x")):
        pts = sorted((r["tokens"], r["activations after forward (MiB)"]) for r in rows if r["checkpointing"] == how)
        if pts:
            label = {"off": "no checkpointing", "hf": "activation_checkpointing_enable()",
                     "deepspeed": "deepspeed.checkpointing"}[how]
            ax.plot(*zip(*pts), style, label=label)
    ax.axhline(model_states_bytes / 2 ** 20, color="gray", ls="--",
               label=f"model states per rank (ZeRO-1, {world_size} ranks)")
    ax.set_xlabel("tokens per micro-batch (batch × sequence length)")
    ax.set_ylabel("MiB per rank")
    ax.set_title("activations grow with tokens; model states do not")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- 3 · flops and MFU

def gpt2_matmul_flops(n_layer: int, d: int, vocab: int, batch: int, seq: int) -> int:
    """Forward FLOPs of GPT-2's matrix multiplications for one micro-batch: per token and layer 24·d² (the
    qkv, projection and two MLP matmuls: 2 FLOPs per multiply-add) and 4·T·d for attention (QKᵀ and AV over
    the whole sequence), plus 2·d·V for the LM head."""
    tokens = batch * seq
    return tokens * (n_layer * (24 * d * d + 4 * seq * d) + 2 * d * vocab)


def step_seconds(records: list[dict]) -> float:
    """Rank 0's median step time from the engine's timers (fwd + bwd + step), over the steps that
    :func:`step_breakdown` takes (those after the profiled one)."""
    return step_breakdown(records)["timers total"] / 1e3


def mfu(fwd_flops: int, seconds: float, peak_flops_per_s: float, recompute: float = 0.0) -> dict[str, float]:
    """Model FLOPs utilization: the FLOPs of a training step, (3 + recompute) × forward FLOPs (the backward pass
    does about twice the forward's multiplications; ``recompute`` more forward passes with activation
    checkpointing), over the step's time, over this rank's measured peak."""
    per_step = (3 + recompute) * fwd_flops
    achieved = per_step / seconds
    return {"FLOPs per step": per_step, "achieved FLOP/s": achieved, "peak FLOP/s": peak_flops_per_s,
            "MFU": achieved / peak_flops_per_s}


_STEP_FACTOR = re.compile(r"FLOPS per GPU = ([\d.]+) \* fwd flops per GPU / iter latency")


def deepspeed_step_factor(profile_text: str) -> float:
    """How many forward passes' FLOPs DeepSpeed's flops profiler counts per training step, read from what it
    wrote (profiler.py, with ``wall_clock_breakdown``: "FLOPS per GPU = <2 + recompute_fwd_factor + 1> * fwd
    flops per GPU / iter latency")."""
    found = _STEP_FACTOR.search(profile_text)
    if found is None:
        raise ValueError("the profile has no 'FLOPS per GPU = k * fwd flops per GPU / iter latency' line: "
                         "it is printed only with \"wall_clock_breakdown\": true")
    return float(found.group(1))


_SUMMARY_STEP = re.compile(r"Profile Summary at step (\d+):")
_LATENCY = re.compile(r"^(fwd|bwd|step|iter) latency:\s+([\d.]+) ([mu]?)s\s*$", re.M)


def profile_summary_step(profile_text: str) -> int:
    """The step number DeepSpeed's flops profiler printed ("Profile Summary at step <n>:"): ``engine.global_steps``
    when ``engine.step()`` prints the profile, after the profiled step's update counted it."""
    found = _SUMMARY_STEP.search(profile_text)
    if found is None:
        raise ValueError("the profile has no 'Profile Summary at step <n>:' line")
    return int(found.group(1))


def profile_latencies_ms(profile_text: str) -> dict[str, float]:
    """The profile's "fwd / bwd / step / iter latency" lines in ms (with ``wall_clock_breakdown`` DeepSpeed prints the
    engine's own timers of the profiled step there)."""
    scale = {"": 1e3, "m": 1.0, "u": 1e-3}
    return {name: float(value) * scale[unit] for name, value, unit in _LATENCY.findall(profile_text)}


def same_as_printed(ms: float, printed_ms: float) -> bool:
    """Whether a time of ``ms`` is what the profile printed as ``printed_ms``: DeepSpeed rounds a duration to 2 decimals
    of the unit it picks (s from 1 s up, ms from 1 ms, µs below), so they differ by half of that last digit at most."""
    unit = 1e3 if printed_ms >= 1e3 else 1.0 if printed_ms >= 1.0 else 1e-3
    return abs(ms - printed_ms) <= 0.005 * unit * (1 + 1e-9)


# ---------------------------------------------------------------- 4 · where a step's time goes

BREAKDOWN = ("fwd", "bwd_inner", "bwd_allreduce", "step")


def breakdown_rows(records: list[dict]) -> list[dict[str, float]]:
    """Rank 0's steps: the engine's wall-clock timers (ms) beside the clock around forward + backward + step."""
    return [{"training step": s.step, **{k: s.timers.get(k, float("nan")) for k in BREAKDOWN},
             "timers total": sum(s.timers.get(k, 0.0) for k in ("fwd", "bwd", "step")), "clock": s.wall_ms}
            for s in read_as(records, StepTime)]


def step_breakdown(records: list[dict]) -> dict[str, float]:
    """Median ms per timer over the steps after the profiled one (the steps before it warm up; it carries the
    profiler's hooks)."""
    profiled = read_as(records, FlopsProfile)[0].profile_step
    rows = [r for r in breakdown_rows(records) if r["training step"] > profiled]
    return {k: statistics.median(r[k] for r in rows) for k in (*BREAKDOWN, "timers total", "clock")}


def comm_rows(records: list[dict]) -> list[dict[str, Any]]:
    """What rank 0's comms logger logged in each step: op, message bytes, how many, and the latencies it logged
    (read as they are; see :func:`course_utils.rank.comms.timed`)."""
    return [{"step": s.step, "op": op, "bytes": size, "calls": len(ms), "logged ms": [round(x, 1) for x in ms]}
            for s in read_as(records, StepTime) for op, entries in s.comm.items() for size, ms in entries]


def fit_alpha_beta(records: list[dict]) -> tuple[float, float]:
    """α (the latency per call, s) and β (s per byte) of rank 0's all_reduce timings (the measurement of notebook 01,
    repeated in this launch), fitted as notebook 01 fits them (:func:`course_utils.kernel.views.distributed.fit_alpha_beta`)."""
    from course_utils.common.records.collectives import AllReduceTime
    from course_utils.kernel.views.distributed import fit_alpha_beta as fit

    return fit(read_as(records, AllReduceTime))


def per_call_ms(records: list[dict], op: str, nbytes: int, rank: int = 0) -> dict[int, float]:
    """Training step → ms of ``rank``'s call of ``op`` with ``nbytes`` message bytes in that step, taken from the comms
    logger's running totals (the column of :func:`comm_rows`): every call of ``op``, whatever its size, adds to one timer, so sorted
    they are the calls in order, and each call's own time is its total minus the total before it. The first call has
    no total before it (its total also holds the calls made before the first logged step) and is left out."""
    calls = sorted((ms, s.step, size) for s in read_as(records, StepTime, rank=rank) for size, logged in s.comm.get(op, [])
                   for ms in logged)
    return {step: ms - before for (before, _, _), (ms, step, size) in zip(calls, calls[1:]) if size == nbytes}


@dataclass
class GradAllReduce:
    """The profiled engine's gradient all-reduce in the steps after the profiled one, on every rank (ms): the engine's
    ``bwd_allreduce`` timer, the call inside it (:func:`per_call_ms`) and the rank's forward + backward before it
    (``fwd`` + ``bwd_inner``), per rank and step."""
    bytes: int
    steps: list[int]
    timer: dict[int, dict[int, float]]
    call: dict[int, dict[int, float]]
    compute: dict[int, dict[int, float]]

    def last_call(self, step: int) -> float:
        """The call on the rank that reached it last, which waited for no one: the all-reduce itself."""
        return min(calls[step] for calls in self.call.values())

    def parts(self, rank: int = 0) -> dict[str, float]:
        """``rank``'s timer split into the all-reduce itself, the wait for the other ranks (its call minus the last
        rank's) and the time outside the call (the timer minus the call), averaged over the steps (so they add up)."""
        itself = statistics.fmean(self.last_call(s) for s in self.steps)
        call = statistics.fmean(self.call[rank][s] for s in self.steps)
        timer = statistics.fmean(self.timer[rank][s] for s in self.steps)
        return {"all-reduce itself": itself, "waiting": call - itself, "call": call, "outside the call": timer - call,
                "timer": timer}

    def calls_outside_timer(self) -> list[tuple[int, int]]:
        """(rank, step) whose call took longer than the timer around it (none, unless the differencing is wrong)."""
        return [(r, s) for r, calls in self.call.items() for s in self.steps if calls[s] > self.timer[r][s]]

    def longest_wait(self, rank: int = 0) -> tuple[int, float, float]:
        """The step where ``rank`` waited longest in the call: (step, its wait, how much longer the slowest other rank's
        forward + backward took than ``rank``'s that step, by the engine's timers)."""
        waits = {s: self.call[rank][s] - self.last_call(s) for s in self.steps}
        step = max(waits, key=waits.get)
        later = max(c[step] for r, c in self.compute.items() if r != rank) - self.compute[rank][step]
        return step, waits[step], later


def grad_allreduce(records: list[dict]) -> GradAllReduce:
    """The gradient all-reduce (the largest all_reduce message) of the steps after the profiled one, on every rank."""
    profiled = read_as(records, FlopsProfile)[0].profile_step
    ranks = sorted({r["rank"] for r in records if r["name"] == StepTime.NAME})
    steps = {r: {s.step: s for s in read_as(records, StepTime, rank=r)} for r in ranks}
    nbytes = max(size for s in steps[0].values() for size, _ in s.comm.get("all_reduce", []))
    call = {r: per_call_ms(records, "all_reduce", nbytes, rank=r) for r in ranks}
    later = sorted(s for s in call[0] if s > profiled and all(s in call[r] for r in ranks))
    return GradAllReduce(nbytes, later,
                         timer={r: {s: steps[r][s].timers["bwd_allreduce"] for s in later} for r in ranks},
                         call={r: {s: call[r][s] for s in later} for r in ranks},
                         compute={r: {s: steps[r][s].timers["fwd"] + steps[r][s].timers["bwd_inner"] for s in later}
                                  for r in ranks})


def grad_allreduce_rows(parts: dict[str, float], predicted_ms: float) -> list[dict[str, Any]]:
    """:meth:`GradAllReduce.parts` as a table, with α–β's prediction above it and how each figure is measured."""
    timer = parts["timer"]
    rows = [("α–β's prediction", predicted_ms, "fitted to the bare all-reduces above"),
            ("the all-reduce itself", parts["all-reduce itself"], "the call on the rank that reached it last"),
            ("+ waiting for the last rank", parts["waiting"], "rank 0's call minus that"),
            ("= the call on rank 0", parts["call"], "the comms logger's running totals, differenced"),
            ("+ outside the call", parts["outside the call"], "the timer minus the call"),
            ("= the bwd_allreduce timer", timer, "the engine's wall-clock timer")]
    return [{"span": name, "ms": round(ms, 1), "share of the timer": f"{ms / timer:.0%}" if i else "", "measured as": how}
            for i, (name, ms, how) in enumerate(rows)]


def all_reduce_rows(records: list[dict]) -> list[dict[str, float]]:
    from course_utils.common.records.collectives import AllReduceTime

    return [{"bytes": r.bytes, "ms": 1e3 * r.seconds} for r in read_as(records, AllReduceTime)]


# ---------------------------------------------------------------- 5 · the monitor

def read_monitor(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every CSV file DeepSpeed's csv_monitor wrote under ``folder``: name → [(samples, value)]."""
    out = {}
    for path in sorted(Path(folder).rglob("*.csv")):
        with open(path) as f:
            rows = list(csv.reader(f))[1:]
        out[path.stem] = [(int(float(step)), float(value)) for step, value in rows]
    return out


def plot_monitor(series: dict[str, list[tuple[int, float]]], names: list[str]):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(names), figsize=(4 * len(names), 3))
    for ax, name in zip(axes if len(names) > 1 else [axes], names):
        ax.plot(*zip(*series[name]), "o-")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("samples")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- 6 · a hang

_OWN_OP = re.compile(r"Rank (\d+) is running collective: CollectiveFingerPrint\(SequenceNumber=\d+,? ?OpType=(\w+)")


def mismatch_reports(rank_logs: dict[int, str]) -> dict[int, str]:
    """What each rank said it was running when ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` found the ranks' collectives
    differ: rank → op type (from the "Detected mismatch between collectives" error in its log)."""
    out = {}
    for text in rank_logs.values():
        for line in text.splitlines():
            if "Detected mismatch between collectives" in line and (m := _OWN_OP.search(line)):
                out[int(m.group(1))] = m.group(2)
    return out




def streamed_lines(result: LaunchResult) -> list[str]:
    """The lines a launch streams into the notebook (the runner's learner filter over ``result.log``: it leaves out
    the INFO lines of torch's C++ core, ``TORCH_CPP_LOG_LEVEL=INFO``'s c10d "client socket has connected" on every
    rank, and DeepSpeed's INFO chatter), for a launch run with ``quiet=True``."""
    from course_utils.kernel.launch.streams import LearnerFilter

    shown = LearnerFilter()
    return [line for line in result.log.splitlines() if shown.shows(line)]


_FRAME = re.compile(r'File "([^"]+)", line (\d+) in (\S+)')


def where_waiting(stacks: dict[int, str]) -> dict[int, dict[str, str]]:
    """Per rank, from its faulthandler dump: the innermost frame (where it waits) and the innermost frame in a
    course script (the line of the training code that got it there)."""
    from course_utils.kernel.launch.stacks import main_thread_stack

    out = {}
    for rank, text in sorted(stacks.items()):
        frames = _FRAME.findall(main_thread_stack(text, frames=64))
        if not frames:
            continue
        script_frame = next((f for f in frames if f[0].startswith("scripts/")), frames[-1])
        out[rank] = {"waiting in": frames[0][2], "script line": f"{script_frame[0]}:{script_frame[1]} "
                                                                f"({script_frame[2]})"}
    return out
