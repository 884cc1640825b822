"""Pipeline parallelism inside the ranks (notebook 13): DeepSpeed's ``PipelineModule`` on a small stack of
equal blocks, its schedule as DeepSpeed's own ``TrainSchedule`` yields it, and each stage's instructions timed
and counted while ``engine.train_batch()`` runs them.

The engine looks every instruction up in ``_INSTRUCTION_MAP`` (``runtime/pipe/engine.py``, ``_exec_schedule``)
and its sends go through ``runtime/pipe/p2p.py``; :func:`instrument` wraps both on one engine, so what is
measured is what DeepSpeed executed, not a model of it.
"""
from __future__ import annotations

import time

WIDTH = 256         # features of each block (Linear → GELU → Linear)
BLOCKS = 8          # blocks of the model: half on each of 2 stages
MICRO = 128         # samples per micro-batch


def block(width: int = WIDTH):
    """One block of the stack: Linear → GELU → Linear (its input and output are ``width`` wide)."""
    import torch.nn as nn

    return nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))


def layers(blocks: int = BLOCKS, width: int = WIDTH, seed: int = 0) -> list:
    """The model as a list of layers, the same weights on every rank (built before the partition)."""
    import torch

    torch.manual_seed(seed)
    return [block(width) for _ in range(blocks)]


def frozen_base_layers(width: int = 64, bottleneck: int = 8) -> list:
    """Exercise 2's model: a frozen base of two wide Linear layers (``requires_grad=False``, as the base weights of a
    fine-tune with adapters), then two small trainable bottlenecks (the adapters) and activations between them.
    DeepSpeed's "parameters" partition weighs only the trainable parameters (``PipelineModule._count_layer_params``),
    and so puts the whole base on the first stage."""
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    base = [nn.Linear(width, 8 * width), nn.GELU(), nn.Linear(8 * width, width)]
    for layer in base:
        layer.requires_grad_(False)
    return [*base, nn.Linear(width, bottleneck), nn.Linear(bottleneck, width), nn.Tanh(),
            nn.Linear(width, bottleneck), nn.Linear(bottleneck, width)]


def mse(output, target):
    import torch.nn.functional as F

    return F.mse_loss(output, target)


def data(batches: int, m: int, width: int = WIDTH, micro: int = MICRO, seed: int = 1) -> list:
    """``batches`` × ``m`` micro-batches of (input, target): a fixed random linear map plus noise."""
    import torch

    g = torch.Generator().manual_seed(seed)
    w = torch.randn(width, width, generator=g) / width ** 0.5
    out = []
    for _ in range(batches * m):
        x = torch.randn(micro, width, generator=g)
        out.append((x, x @ w + 0.1 * torch.randn(micro, width, generator=g)))
    return out


def engine(layers: list, config: dict, m: int | None, stage: int = 0, partition: str = "uniform", stages: int = 2):
    """A pipeline engine over ``layers`` cut into ``stages`` stages, ``m`` micro-batches per ``train_batch``, at ZeRO
    ``stage``; the ranks beyond ``stages`` become data-parallel replicas of each stage. ``m=None``: as many
    micro-batches as DeepSpeed derives from the config's own batch keys."""
    import contextlib
    import copy
    import io

    import deepspeed
    from deepspeed.pipe import PipelineModule

    cfg = copy.deepcopy(config)
    if m is not None:            # DeepSpeed derives train_batch_size from the micro-batch, m and the replicas
        cfg["gradient_accumulation_steps"] = m
        cfg.pop("train_batch_size", None)
    cfg["zero_optimization"]["stage"] = stage
    with contextlib.redirect_stdout(io.StringIO()):         # PipelineModule prints its partition on rank 0
        pipe = PipelineModule(layers=layers, num_stages=stages, loss_fn=mse, partition_method=partition)
    built, *_ = deepspeed.initialize(model=pipe, model_parameters=list(pipe.parameters()), config=cfg)
    return built


def from_batch_keys(config: dict, train_batch_size: int, width: int = WIDTH) -> dict:
    """Exercise 1's pipeline: ``config`` with ``train_batch_size`` instead of ``gradient_accumulation_steps``, so that
    DeepSpeed derives the micro-batches ``train_batch`` runs; one ``train_batch``, the schedule this stage executed
    counted (steps without a forward or backward pass)."""
    cfg = {k: v for k, v in config.items() if k != "gradient_accumulation_steps"}
    built = engine(layers(width=width), {**cfg, "train_batch_size": train_batch_size}, None)
    trace = instrument(built)
    built.train_batch(iter(data(1, built.micro_batches, width=width, seed=1 + built.grid.data_parallel_id)))
    return {"stage": built.stage_id, "data_parallel": built.dp_world_size, "train_batch_size": train_batch_size,
            "micro_batch": cfg["train_micro_batch_size_per_gpu"], "m": built.micro_batches,
            "idle_steps": trace.idle_steps(), "steps": len(trace.steps)}


def schedule(m: int, stages: int, stage: int) -> list[list[str]]:
    """The instruction stream DeepSpeed's ``TrainSchedule`` yields for one stage: one list per step."""
    from deepspeed.runtime.pipe.schedule import TrainSchedule

    return [[repr(cmd) for cmd in step] for step in TrainSchedule(micro_batches=m, stages=stages, stage_id=stage)]


class Trace:
    """Each executed instruction of one engine: (name, kwargs, start, end) and the bytes its sends moved."""

    def __init__(self):
        self.events: list[tuple] = []
        self.sent: dict[str, int] = {}
        self.steps: list[list[str]] = []      # the instruction names of each schedule step, as executed
        self._current = None

    def clear(self) -> None:
        self.events, self.sent, self.steps = [], {}, []

    def idle_steps(self) -> int:
        return sum(1 for step in self.steps if not {"ForwardPass", "BackwardPass"} & set(step))

    def by_instruction(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, _, t0, t1 in self.events:
            out[name] = out.get(name, 0.0) + (t1 - t0) * 1e3
        return {k: round(v, 2) for k, v in out.items()}

    def busy(self) -> float:
        return sum(t1 - t0 for name, _, t0, t1 in self.events if name in ("ForwardPass", "BackwardPass"))

    def window(self) -> tuple[float, float]:
        compute = [(t0, t1) for name, _, t0, t1 in self.events if name in ("ForwardPass", "BackwardPass")]
        return self.events[0][2], max(t1 for _, t1 in compute)

    def in_flight(self) -> int:
        held = most = 0
        for name, *_ in self.events:
            held += {"ForwardPass": 1, "BackwardPass": -1}.get(name, 0)
            most = max(most, held)
        return most

    def durations(self) -> list[float]:
        return [(t1 - t0) * 1e3 for *_, t0, t1 in self.events]

    def executed(self) -> list[str]:
        return [f"{name}(buffer_id={kw['buffer_id']})" if "buffer_id" in kw else f"{name}()"
                for name, kw, *_ in self.events]


def instrument(engine) -> Trace:
    """Time every instruction ``engine`` executes and count what its point-to-point sends move.

    The engine binds ``self._INSTRUCTION_MAP[type(cmd)]`` for each instruction: an instance attribute of the same
    name takes precedence over the class's, so only this engine is wrapped."""
    from deepspeed.runtime.pipe import p2p

    trace = Trace()

    def timed(name, fn):
        def run(self, **kwargs):
            trace._current = name
            t0 = time.perf_counter()
            fn(self, **kwargs)
            trace.events.append((name, kwargs, t0, time.perf_counter()))
            trace.steps[-1].append(name)
            trace._current = None
        return run

    def marked(schedule):                  # the engine iterates the schedule step by step: mark each step
        for step in schedule:
            trace.steps.append([])
            yield step

    plain_exec = engine._exec_schedule
    engine._exec_schedule = lambda schedule: plain_exec(_Marked(schedule, marked))
    engine._INSTRUCTION_MAP = {cls: timed(cls.__name__, fn) for cls, fn in type(engine)._INSTRUCTION_MAP.items()}
    if not getattr(p2p.send, "_counted", False):
        plain_send = p2p.send

        def send(tensor, dest_stage, async_op=False):
            key = _TRACES[-1]._current or "outside an instruction"
            _TRACES[-1].sent[key] = _TRACES[-1].sent.get(key, 0) + tensor.numel() * tensor.element_size()
            return plain_send(tensor, dest_stage, async_op)
        send._counted = True
        p2p.send = send
    _TRACES.append(trace)
    return trace


_TRACES: list[Trace] = []      # the engine being measured is the last one instrumented


class _Marked:
    """A schedule whose iteration marks each step; ``num_pipe_buffers()`` still answers as the schedule's."""

    def __init__(self, schedule, marked):
        self.schedule, self.marked = schedule, marked

    def num_pipe_buffers(self) -> int:
        return self.schedule.num_pipe_buffers()

    def __iter__(self):
        return self.marked(self.schedule)


def measure_batch(engine, trace: Trace, batches) -> tuple[float, tuple[float, float, float]]:
    """Run one ``train_batch`` with every stage starting together; returns its loss and this stage's
    (idle share, busy ms, window ms). The window runs from the first instruction of any stage to the end of the
    last forward or backward pass of any stage: the span in which the pipeline computes."""
    import torch
    import torch.distributed as dist

    dist.barrier()
    trace.clear()
    loss = float(engine.train_batch(batches))
    mine = torch.tensor(trace.window(), dtype=torch.float64)
    every = [torch.zeros(2, dtype=torch.float64) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    window = max(w[1].item() for w in every) - min(w[0].item() for w in every)
    return loss, (1 - trace.busy() / window, trace.busy() * 1e3, window * 1e3)


def stage_parameters(pipe) -> tuple[list[int], list[int]]:
    """Parameters each stage of ``pipe`` holds, all of them and the trainable ones (every rank counts its own
    stage; gathered over the ranks)."""
    import torch.distributed as dist

    params = list(pipe.parameters())
    mine = (pipe.stage_id, sum(p.numel() for p in params), sum(p.numel() for p in params if p.requires_grad))
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    by_stage = {s: (n, t) for s, n, t in every}
    return [by_stage[s][0] for s in range(pipe.num_stages)], [by_stage[s][1] for s in range(pipe.num_stages)]
