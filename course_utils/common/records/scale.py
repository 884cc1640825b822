"""This machine's own figures (``scripts/16_this_machine.py``), measured by one launched rank for the real-scale
projections: the same step-time model that projects a GPU first projects this machine's toy runs from these."""
from __future__ import annotations

from dataclasses import dataclass

from course_utils.common.record import Record


@dataclass
class MachineFigures(Record, name="machine_figures"):
    threads: int                    # the rank's torch threads (its share of the cores)
    matmul_flops_s: float           # best fp32 matmul FLOP/s of the rank (n × n, 2n³ FLOPs)
    matmul_n: int
    copy_bytes_s: float             # host memory copy: bytes read + written per second (torch copy_)
    copy_bytes: int                 # the size of the copied tensor
    cpu_adam_s_per_param: float     # DeepSpeedCPUAdam's step, seconds per parameter with ``threads`` threads
    cpu_adam_params: int
    disk_write_bytes_s: float       # DeepSpeed's async_io op (O_DIRECT), the swap folder's disk
    disk_read_bytes_s: float
    disk_bytes: int
    others_cores: float             # cores other programs used while the rank measured (perf.busy_seconds)

    @property
    def cpu_adam_s_per_param_core(self) -> float:
        """Seconds per parameter on one core: the step is elementwise and split across the threads."""
        return self.cpu_adam_s_per_param * self.threads
