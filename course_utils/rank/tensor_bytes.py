"""A rank's memory limit as a count: the bytes of every tensor storage torch allocates while the limit is on, minus
those freed; an allocation that takes the count past the cap raises ``torch.OutOfMemoryError``, as a GPU's allocator
refuses one past its memory.

A count, not the machine's memory. A memory cgroup (notebooks 05 and 16) counts the pages a process touches: heap
pages the allocator keeps, and file pages the process reads in for the first time after it joined (library code run
for the first time, DeepSpeed's ops, data) — on cgroup v1 a page read into the page cache is charged to the cgroup
that read it, so the same step charges tens of MiB more after the machine has dropped its cache than before. This
count is the same on every machine and in every run: it depends on the program alone, as a GPU's caching allocator's
``max_memory_allocated`` does.

How it counts (:class:`TensorBytes`, a ``TorchDispatchMode``, the mechanism of torch's own ``MemTracker`` and
``FlopCounterMode``): every aten operator the rank's thread calls goes through it — the model's, the autograd
backward's (on a CPU it runs in the calling thread), DeepSpeed's ZeRO-3 gathers and partitions, and the collectives
(``c10d`` operators; their outputs are allocated by the caller). A storage an operator returns that none of its
inputs holds is a new allocation: its bytes are added, and subtracted when torch frees it (a weak reference's
callback). A view or an in-place result shares an input's storage and adds nothing; a storage resized in place
(``resize_``) is counted at its new size. What torch allocates outside operators (inside a kernel, gloo's threads)
and what Python objects take are not counted.
"""
from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode


def _tensors(values):
    """The tensors among an operator's arguments or results: themselves, or in a list or tuple (aten's signatures nest
    no deeper)."""
    for value in values:
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from (item for item in value if isinstance(item, torch.Tensor))


def _storages(values) -> list:
    return [tensor.untyped_storage() for tensor in _tensors(values) if tensor.device.type != "meta"]


class TensorBytes(TorchDispatchMode):
    """While active: ``count``, the bytes of the live storages allocated under it; ``peak``, the most since
    :meth:`reset_peak`; past ``cap_bytes`` (if given) the allocating operator raises ``torch.OutOfMemoryError``."""

    def __init__(self, cap_bytes: int | None = None):
        super().__init__()
        self.cap_bytes, self.count, self.peak, self._live = cap_bytes, 0, 0, {}
        self.refused: tuple[str, int] | None = None     # (operator, count) of the allocation the cap refused

    def reset_peak(self) -> None:
        self.peak = self.count

    def _freed(self, key: int) -> None:
        self.count -= self._live.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        held_by_inputs = {storage._cdata for storage in _storages((*args, *(kwargs or {}).values()))}
        for storage in _storages(out if isinstance(out, (list, tuple)) else (out,)):
            key, size = storage._cdata, storage.nbytes()
            before = self._live.get(key)
            if before is None:
                if key in held_by_inputs:
                    continue            # a view or in-place result of a storage allocated before counting began
                weakref.finalize(storage, self._freed, key)
            self._live[key] = size
            self.count += size - (before or 0)
        if self.count > self.peak:
            self.peak = self.count
            if self.cap_bytes is not None and self.count > self.cap_bytes:
                self.refused = str(func), self.count
                raise torch.OutOfMemoryError(
                    f"{func} took this rank's tensors to {self.count / 2**20:.1f} MiB, past its limit of "
                    f"{self.cap_bytes / 2**20:.0f} MiB (course_utils.rank.tensor_bytes)")
        return out
