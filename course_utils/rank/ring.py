"""The ring all-reduce exercise inside a rank (notebook 01): count the bytes a rank sends, and trace,
step by step, which chunk each rank sends and what every chunk holds.

scripts/01_ring.py runs the learner's function under these (the course's own ring, in
:mod:`course_utils.rank.ring_reference`, while the exercise is not written); the notebook draws the trace with :func:`course_utils.kernel.views.distributed.plot_ring_steps`.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator

from course_utils.common.records.collectives import RingStep


@contextlib.contextmanager
def _wrapped(module: Any, wrappers: dict[str, Callable[[Callable], Callable]]) -> Iterator[None]:
    """Replace ``module.<name>`` by ``wrapper(original)`` for each entry inside the block, then restore.

    Code that calls ``dist.send(...)`` looks the function up at call time, so it is observed unchanged.
    """
    originals = {name: getattr(module, name) for name in wrappers}
    for name, wrap in wrappers.items():
        setattr(module, name, wrap(originals[name]))
    try:
        yield
    finally:
        for name, fn in originals.items():
            setattr(module, name, fn)


@contextlib.contextmanager
def count_sent_bytes() -> Iterator[dict[str, int]]:
    """Count the bytes this rank sends with ``dist.send`` / ``dist.isend`` inside the block."""
    import torch.distributed as dist

    counter = {"bytes": 0, "messages": 0}

    def counting(fn: Callable) -> Callable:
        def wrapper(tensor, *args, **kwargs):
            counter["bytes"] += tensor.numel() * tensor.element_size()
            counter["messages"] += 1
            return fn(tensor, *args, **kwargs)
        return wrapper

    with _wrapped(dist, {"send": counting, "isend": counting}):
        yield counter


# Calls that move data between ranks other than the point-to-point ones (send/isend/recv/irecv): a ring uses none.
# barrier moves no data and stays allowed. Each name is wrapped wherever one of the modules below has it.
COLLECTIVE_CALLS = ("all_reduce", "all_reduce_coalesced", "inference_all_reduce", "reduce", "broadcast",
                    "broadcast_object_list", "all_gather", "all_gather_into_tensor", "all_gather_single",
                    "all_gather_coalesced", "all_gather_object", "_all_gather_base", "allgather_fn", "reduce_scatter",
                    "reduce_scatter_tensor", "reduce_scatter_single", "_reduce_scatter_base", "reduce_scatter_fn",
                    "all_to_all", "all_to_all_single", "scatter", "gather", "gather_object", "scatter_object_list")


@contextlib.contextmanager
def record_collectives() -> Iterator[dict[str, int]]:
    """Count the collectives (:data:`COLLECTIVE_CALLS`) this rank calls inside the block, through
    ``torch.distributed`` (as ``dist.<name>``) or ``deepspeed.comm``: name → calls. The calls still run. Only the
    outermost call counts: ``deepspeed.comm.all_reduce`` runs ``torch.distributed.all_reduce`` and counts once."""
    import torch.distributed as dist

    modules = [("dist", dist), ("torch.distributed.distributed_c10d", dist.distributed_c10d)]
    try:
        import deepspeed.comm
        import deepspeed.comm.comm
        modules += [("deepspeed.comm", deepspeed.comm), ("deepspeed.comm", deepspeed.comm.comm)]
    except ImportError:
        pass
    called: dict[str, int] = {}
    depth = [0]

    def recording(label: str, name: str) -> Callable[[Callable], Callable]:
        def wrap(fn: Callable) -> Callable:
            @functools.wraps(fn)
            def wrapper(*args, **kwargs):
                if depth[0] == 0:
                    called[f"{label}.{name}"] = called.get(f"{label}.{name}", 0) + 1
                depth[0] += 1
                try:
                    return fn(*args, **kwargs)
                finally:
                    depth[0] -= 1
            return wrapper
        return wrap

    with contextlib.ExitStack() as stack:
        for label, module in modules:
            stack.enter_context(_wrapped(module, {name: recording(label, name) for name in COLLECTIVE_CALLS
                                                  if callable(getattr(module, name, None))}))
        yield called


def ring_bytes_expected(tensor_bytes: int, world_size: int) -> float:
    """Bytes each rank sends in a ring all-reduce: 2(N−1) steps of one S/N chunk each."""
    return 2 * (world_size - 1) / world_size * tensor_bytes


def _dst(args: tuple, kwargs: dict, key: str) -> int | None:
    value = args[0] if args else kwargs.get(key)
    return None if value is None else int(value)


def trace_ring(ring_all_reduce: Callable, device: str, elements_per_chunk: int = 2) -> list[RingStep]:
    """Run ``ring_all_reduce`` on a tensor in which this rank holds 2**rank everywhere, and record a
    :class:`RingStep` per send: a step starts at a send and ends at the next one (or the return)."""
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    tensor = torch.full((world * elements_per_chunk,), float(2 ** rank), device=device)
    base, size = tensor.data_ptr(), tensor.element_size()

    def held() -> list[float]:
        return [float(tensor[c * elements_per_chunk]) for c in range(world)]

    steps = [RingStep(rank=rank, step=0, sent_chunk=None, sent_to=None, sent=None, received_from=None,
                      received=None, held=held())]
    pending: dict[str, Any] = {}          # the current step's received buffer, read when the step ends

    def close_step() -> None:
        if len(steps) > 1 and not steps[-1].held:
            buffer = pending.pop("buffer", None)
            if buffer is not None:
                steps[-1].received = float(buffer.flatten()[0])
            steps[-1].held = held()

    def sending(fn: Callable) -> Callable:
        def wrapper(chunk, *args, **kwargs):
            close_step()
            offset = (chunk.data_ptr() - base) // size
            index = offset // elements_per_chunk if 0 <= offset < tensor.numel() else None
            steps.append(RingStep(rank=rank, step=len(steps), sent_chunk=index, sent_to=_dst(args, kwargs, "dst"),
                                  sent=float(chunk.flatten()[0]), received_from=None, received=None, held=[]))
            return fn(chunk, *args, **kwargs)
        return wrapper

    def receiving(fn: Callable) -> Callable:
        def wrapper(buffer, *args, **kwargs):
            if len(steps) > 1:
                steps[-1].received_from = _dst(args, kwargs, "src")
                pending["buffer"] = buffer
            return fn(buffer, *args, **kwargs)
        return wrapper

    with _wrapped(dist, {"send": sending, "isend": sending, "recv": receiving, "irecv": receiving}):
        ring_all_reduce(tensor)
    close_step()
    return steps
