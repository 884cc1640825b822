"""The records of notebook 04's offload ladder (scripts/04_offload_ladder.py): one ``Rung`` per rung and rank,
with every model state by the DeepSpeed structure, device and side holding it (``Holding`` rows)."""
from __future__ import annotations

from dataclasses import dataclass

from course_utils.common.record import Record


@dataclass
class Holding:
    """Bytes of one kind of state held in one DeepSpeed structure on one device type (one row of ``Rung.held``)."""
    state: str            # params | grads | optimizer | buffers (memory.tensor_inventory's categories)
    structure: str        # where the engine holds it, e.g. "DeepSpeedCPUAdam.state[p]['exp_avg']"
    device: str           # the tensors' device type: cpu, cuda, ...
    bytes: int
    tensors: int          # storages counted
    side: str = "accelerator"   # where DeepSpeed placed it: accelerator | host (host_side_storages)


@dataclass
class Rung(Record, name="rung"):
    """One rung of the ladder on one rank: speed, where the model states are, and the process's memory."""
    name: str
    rank: int
    dtype: str
    step_seconds: float           # median of the timed steps (forward + backward + step, no measuring)
    accelerator: str              # the accelerator's device type ("cuda"; "cpu" on a CPU-only machine)
    model_state_bytes: int        # params + grads + optimizer states in memory, wherever they are
    device_bytes: int             # model states on tensors of the accelerator's device type
    host_bytes: int               # model states on "cpu" tensors when the accelerator is not the CPU (else 0)
    accelerator_side_bytes: int   # model states DeepSpeed placed on the accelerator (its own flags and structures)
    host_side_bytes: int          # model states DeepSpeed placed in host memory (offload_optimizer / offload_param)
    nvme_bytes: int               # bytes of this rank's swap files on disk (NVMe offload), else 0
    held: list                    # Holding rows: every state by structure, device and side
    accelerator_peak: int
    gathered_in_forward: int      # stage 3: most parameter elements gathered whole at a module's forward
    persistent_numel: int         # stage 3: elements of the parameters kept whole on every rank
    optimizer: str                # the torch optimizer class doing the step
    loss: float
    swap_files: list | None = None   # NVMe: the swap files found in the rank's folder
    phases: dict | None = None       # median seconds: "forward + backward", "engine.step()", "optimizer kernel"
    swap_buffers: dict | None = None  # NVMe: the page-locked host buffers the swappers allocated (swap_buffers())
    locked_bytes: int = 0         # the rank's page-locked memory (Linux VmLck) while the engine lived

    def __post_init__(self) -> None:       # read back from JSON (read_as, as_records), the rows are dicts
        self.held = [h if isinstance(h, Holding) else Holding(**h) for h in self.held]
