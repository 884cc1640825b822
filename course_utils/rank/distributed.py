"""Distributed basics inside a rank: who it is, which device and backend it uses, every collective
once, which collectives ZeRO's gradient reduction calls, and all_reduce timing. (The ring all-reduce exercise's
byte counter and step tracer are in :mod:`course_utils.rank.ring`; notebook 02's exercise functions have the course's
versions in ``scripts/02_train.py`` itself, outside the modules a notebook imports.)

The scripts call these in the ranks; the notebook draws their records with
:mod:`course_utils.kernel.views.distributed`.
"""
from __future__ import annotations

import os
import socket
import sys
import time
from typing import Any, Callable

from course_utils.common.records.collectives import AllReduceTime, CollectiveRow, Identity, ZeroCollectives


def rank_identity() -> Identity:
    """Who this process is, as the ``deepspeed`` launcher told it (environment variables and arguments).

    ``CROSS_RANK`` is the launcher's name for the node rank (``--node_rank``), ``LOCAL_SIZE`` the
    number of ranks on this node. ``argv`` shows what the launcher passed: ``--local_rank=N`` ahead of
    the script's own arguments (``deepspeed/launcher/launch.py``), unless it ran with ``--no_local_rank``.
    A rank whose node's launcher was started over ssh (pdsh) has sshd's ``SSH_CONNECTION`` ("client address,
    client port, server address, server port"): the server address is the host as the launcher reached it.
    """
    env = os.environ
    connection = env.get("SSH_CONNECTION", "").split()
    return Identity(node_rank=int(env.get("CROSS_RANK", 0)), local_rank=int(env.get("LOCAL_RANK", 0)),
                    rank=int(env.get("RANK", 0)), world_size=int(env.get("WORLD_SIZE", 1)),
                    local_size=int(env.get("LOCAL_SIZE", 1)), master_addr=env.get("MASTER_ADDR"),
                    master_port=int(env.get("MASTER_PORT", 0)), host=socket.gethostname(), pid=os.getpid(),
                    argv=list(sys.argv[1:]), ssh_host=connection[2] if len(connection) == 4 else None)


def backends_available() -> dict[str, bool]:
    """Which ``torch.distributed`` backends this torch build (and its installed plugins) can use."""
    import torch.distributed as dist

    found = {"nccl": dist.is_nccl_available(), "gloo": dist.is_gloo_available(), "mpi": dist.is_mpi_available()}
    try:                                      # ccl comes from Intel's oneCCL bindings, a separate package
        import oneccl_bindings_for_pytorch  # noqa: F401
        found["ccl"] = True
    except ImportError:
        found["ccl"] = False
    return found


def choose_device(local_rank: int, local_size: int, cpu: bool = False) -> tuple[str, str]:
    """(device, backend) for a demo rank: the accelerator with its backend when every rank of this
    node gets its own GPU, otherwise (or with ``cpu=True``) CPU tensors over gloo. nccl cannot put
    two ranks on one GPU, which is what "nodes" simulated on one GPU machine would do."""
    import torch
    from deepspeed.accelerator import get_accelerator

    acc = get_accelerator()
    if not cpu and acc.device_name() != "cpu" and local_size <= torch.cuda.device_count():
        return acc.device_name(local_rank), acc.communication_backend_name()
    return "cpu", "gloo"


def _values(t) -> list:
    return [round(float(x), 4) for x in t.flatten().tolist()]


def run_collectives(device: str) -> list[CollectiveRow]:
    """Run every collective once on small tensors; one row per collective with this rank's
    tensor before and after (and how reduce_scatter was done, since backends differ there).

    Rank r starts from ``[10r+1, 10r+2, …]`` (world_size numbers), so every output can be traced
    back to the ranks it came from.
    """
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()

    def start() -> "torch.Tensor":
        return torch.arange(1, world + 1, dtype=torch.float32, device=device) + 10 * rank

    rows = []

    def row(name: str, before, after, how: str) -> None:
        rows.append(CollectiveRow(name, rank, _values(before), _values(after), how))

    t = start() if rank == 0 else torch.zeros(world, device=device)
    before = t.clone()
    dist.broadcast(t, src=0)
    row("broadcast", before, t, "src=0: rank 0's tensor copied to every rank")

    t = start()
    before = t.clone()
    dist.reduce(t, dst=0, op=dist.ReduceOp.SUM)
    row("reduce", before, t, "dst=0, SUM: only rank 0's result is defined")

    t = start()
    before = t.clone()
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    row("all_reduce", before, t, "SUM: every rank gets the elementwise sum")

    t = start()
    out, how = reduce_scatter(t)
    row("reduce_scatter", t, out, how)

    t = torch.tensor([10.0 * rank + 1], device=device)
    gathered = [torch.zeros_like(t) for _ in range(world)]
    dist.all_gather(gathered, t)
    row("all_gather", t, torch.cat(gathered), "every rank gets every rank's tensor, in rank order")

    t = torch.tensor([float(rank)], device=device)
    waited = time.perf_counter()
    dist.barrier()
    row("barrier", t, t, f"no data: waits until every rank arrives ({1e3 * (time.perf_counter() - waited):.1f} ms here)")
    return rows


def reduce_scatter(t) -> tuple[Any, str]:
    """SUM-reduce ``t`` (world_size × k elements) and keep this rank's k-element slice.

    Tries both APIs torch offers, the list form ``dist.reduce_scatter`` and the flat-tensor form
    (``dist.reduce_scatter_single``; older torch calls it ``reduce_scatter_tensor``, a name torch
    2.13 deprecates; the form NCCL prefers), and reports which ones this backend runs.
    Where neither works, it falls back to all_reduce + slice (same result, about twice the traffic
    of a real reduce_scatter). Returns (slice, a note saying what worked).
    """
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    flat = "reduce_scatter_single" if hasattr(dist, "reduce_scatter_single") else "reduce_scatter_tensor"
    attempts = {"reduce_scatter": lambda out: dist.reduce_scatter(out, list(t.clone().chunk(world))),
                flat: lambda out: getattr(dist, flat)(out, t.clone())}
    result, notes = None, []
    for name, call in attempts.items():
        out = torch.zeros(t.numel() // world, dtype=t.dtype, device=t.device)
        try:
            call(out)
        except (RuntimeError, ValueError, NotImplementedError) as e:
            notes.append(f"{name}: not supported ({str(e).splitlines()[0][:80]})")
            continue
        notes.append(f"{name}: ok")
        result = out if result is None else result
    if result is None:
        full = t.clone()
        dist.all_reduce(full)
        result = full.chunk(world)[rank].clone()
        notes.append("used all_reduce + slice instead")
    return result, "; ".join(notes)


def zero_step_collectives(stage: int, device: str) -> list[ZeroCollectives]:
    """Build a small two-layer model with ZeRO ``stage`` and ``"reduce_scatter": true`` (its default),
    take one training step, and record which collectives each phase (forward, backward, step) called,
    read from DeepSpeed's comms logger (:mod:`course_utils.rank.comms`: one logging window per phase).
    """
    import deepspeed
    import torch
    import torch.distributed

    from course_utils.rank.comms import logged, with_comms_logger

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64))
    zero = {"stage": stage, "reduce_scatter": True}
    if stage == 3:
        zero["stage3_param_persistence_threshold"] = 0       # partition every parameter, however small
    config = {"train_micro_batch_size_per_gpu": 1, "steps_per_print": 10**9, "zero_optimization": zero}
    engine, *_ = deepspeed.initialize(model=model, config=with_comms_logger(config),
                                      optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3))
    rank = torch.distributed.get_rank()
    x = torch.randn(1, 64, generator=torch.Generator().manual_seed(rank)).to(engine.device)
    rows = []

    def phase(name: str, work: Callable[[], Any]) -> Any:
        with logged() as window:
            out = work()
        calls = {op: sum(counts.values()) for op, counts in window.messages.items()}
        rows.append(ZeroCollectives(stage=stage, rank=rank, phase=name, calls=dict(sorted(calls.items()))))
        return out

    try:
        loss = phase("forward", lambda: engine(x).pow(2).mean())
        phase("backward", lambda: engine.backward(loss))
        phase("step", engine.step)
    finally:
        engine.destroy()
    return rows


BURST_BYTES = 2 ** 22     # a timed burst of back-to-back all_reduces moves about this many bytes (at most BURST_CALLS calls)
BURST_CALLS = 32
WARMUP_CALLS = 3


def time_all_reduce(sizes: list[int], device: str, repeats: int = 5) -> list[AllReduceTime]:
    """Median seconds of one ``all_reduce(SUM)`` on float32 tensors of each size (elements), measured so that a
    busy machine distorts it as little as it can:

    - ``WARMUP_CALLS`` untimed calls per size first (a process's first collectives pay for connections, buffers and
      cold caches: on 2 shared cores the very first size measured came out several times slower than the next);
    - ``repeats`` rounds that visit every size in turn, so that a slow moment of the machine falls on every size
      alike, not on one point of the curve;
    - each sample a burst of back-to-back calls (up to ``BURST_CALLS``, about ``BURST_BYTES`` in all) after a
      barrier, divided by its length: one call of a small message is shorter than a time slice of the scheduler,
      and a single timed call mostly measures when the other rank got its core back;
    - the burst ends with a sync on the result (``.cpu()``), for devices whose collectives return early.

    The median of the rounds is kept."""
    import statistics

    import torch
    import torch.distributed as dist

    tensors = {n: torch.zeros(n, dtype=torch.float32, device=device) for n in sizes}   # zeros: sums stay finite
    calls = {n: max(1, min(BURST_CALLS, BURST_BYTES // (4 * n))) for n in sizes}
    for t in tensors.values():
        for _ in range(WARMUP_CALLS):
            dist.all_reduce(t)
    samples: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(repeats):
        for n, t in tensors.items():
            dist.barrier()
            started = time.perf_counter()
            for _ in range(calls[n]):
                dist.all_reduce(t)
            t[:1].cpu()
            samples[n].append((time.perf_counter() - started) / calls[n])
    rows = []
    for n in sizes:
        seconds = statistics.median(samples[n])
        rows.append(AllReduceTime(elements=n, bytes=4 * n, seconds=seconds, gbytes_per_s=4 * n / seconds / 1e9))
    return rows
