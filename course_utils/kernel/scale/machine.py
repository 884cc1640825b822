"""This machine as a row of the hardware table, from figures one launched rank measured
(``course_utils.rank.machine_figures``: notebook 16's ZeRO-2 + offload_optimizer launch before it joins its limit, or
``scripts/16_this_machine.py``): the step-time model of :mod:`.project` projects this machine's own toy runs from them
first. A model that cannot predict the machine it runs on is not to be trusted for a GPU.

On a CPU-only machine the "device" is the host: compute runs at the measured matmul rate, an offload "transfer" is a
memory copy at the measured copy rate, and the optimizer step runs DeepSpeedCPUAdam's measured seconds per parameter."""
from __future__ import annotations

from course_utils.common.record import read_as
from course_utils.common.records.scale import MachineFigures
from course_utils.kernel.scale import counts, specs
from course_utils.kernel.launch.options import launches
from course_utils.kernel.scale.project import Projection, Term

@launches(procs=1)
def measure(swap_dir, timeout: int = 300) -> MachineFigures:
    """One rank measures this machine (a matmul, a memory copy, DeepSpeedCPUAdam, the disk under ``swap_dir``). The
    sizes are the script's defaults also in a smoke run: smaller copies and Adam steps would fit in the processor's
    caches and measure those instead of memory (2 M parameters of Adam ran 14 × faster per parameter than 16 M here)."""
    from course_utils.kernel import launch

    result = launch.deepspeed("16_this_machine.py", "--swap_dir", swap_dir, procs=1, timeout=timeout, quiet=True)
    return read_as(result.records, MachineFigures)[0]


def measured_by(outcome, swap_dir, timeout: int = 300) -> MachineFigures:
    """The figures a launch of notebook 16 measured before it joined its limit (``bigger.try_sizes(...,
    measure_machine=True)``); where that launch was skipped (a CPU without a memory cgroup), one rank's launch of its
    own measures them (:func:`measure`). A GPU machine always runs that launch: it caps the CUDA allocator instead."""
    return outcome.figures if outcome.figures is not None else measure(swap_dir, timeout)


def as_gpu(figures: MachineFigures, name: str = "this machine") -> specs.Gpu:
    """This machine as a table row: the measured matmul rate for "peak", the measured copy rate for every link."""
    copy = specs.Link("memory copy here", figures.copy_bytes_s / 2,
                      f"measured here: {figures.copy_bytes_s / 1e9:.3g} GB/s read + written")
    return specs.Gpu(name, figures.matmul_flops_s, 0.0, figures.copy_bytes_s, copy, copy,
                     f"measured here: fp32 matmul {figures.matmul_n}² on {figures.threads} threads")


def toy_step(label: str, figures: MachineFigures, params: int, matmul_params: float, tokens: int, layers: int,
             hidden: int, seq: int, offload_optimizer: bool, offload_param: bool, nvme: bool, b: float = 4,
             swap_b: float = 2) -> Projection:
    """One rank's step of a toy configuration of notebook 16, projected on this machine from its own figures.

    Every configuration runs an Adam step over all parameters on the CPU (the device is the host); offload adds the
    copies between DeepSpeed's device-side and host-side buffers (``b``: fp32 here), NVMe the swap files' reads and
    writes (``swap_b``: DeepSpeed's parameter swapper is bfloat16 on a CPU, notebook 04; notebook 16's keys keep no
    parameter in host memory, ``max_in_cpu`` 0)."""
    gpu = as_gpu(figures)
    fwd = counts.forward_flops(matmul_params, tokens, layers, hidden, seq)
    terms = [Term("compute", counts.step_flops(fwd), "FLOP", gpu.bf16_flops, gpu.source),
             Term("optimizer step", params, "parameters", 1 / figures.cpu_adam_s_per_param,
                  f"DeepSpeedCPUAdam measured here: {figures.cpu_adam_s_per_param * 1e9:.3g} ns a parameter")]
    if offload_optimizer or offload_param:
        moved = counts.offload_moved(params, 1, True, offload_param, b, stage=3 if offload_param else 2, master=b)
        terms.append(Term("offload copies", 2 * (moved["to host"] + moved["to device"]), "B", figures.copy_bytes_s,
                          gpu.host_link.source))
    if nvme:
        moved = counts.nvme_moved(params, 1, offload_param, swap_b, master=b, max_in_cpu=0)   # 16's keys: max_in_cpu 0
        terms.append(Term("NVMe", moved["read"], "B", figures.disk_read_bytes_s,
                          f"async_io read measured here: {figures.disk_read_bytes_s / 1e9:.3g} GB/s"))
        terms.append(Term("NVMe write", moved["write"], "B", figures.disk_write_bytes_s,
                          f"async_io write measured here: {figures.disk_write_bytes_s / 1e9:.3g} GB/s"))
    return Projection(label, "this machine (its own measured figures)", terms,
                      {"MFU": 1.0, "overlap": "none: on one CPU rank the terms run one after the other",
                       "tokens": tokens})


def describe(figures: MachineFigures) -> str:
    """The measured figures, one line each, with what else ran meanwhile."""
    lines = [f"fp32 matmul ({figures.matmul_n}²):       {figures.matmul_flops_s / 1e9:8.1f} GFLOP/s",
             f"memory copy ({figures.copy_bytes / 2**20:.0f} MiB):      {figures.copy_bytes_s / 1e9:8.2f} GB/s read + written",
             f"DeepSpeedCPUAdam ({figures.cpu_adam_params / 1e6:.0f} M):  {figures.cpu_adam_s_per_param * 1e9:8.2f} ns a "
             f"parameter on {figures.threads} threads = {figures.cpu_adam_s_per_param_core * 1e9:.2f} ns on one core",
             f"disk through async_io ({figures.disk_bytes / 2**20:.0f} MiB): write {figures.disk_write_bytes_s / 1e9:.2f} GB/s, "
             f"read {figures.disk_read_bytes_s / 1e9:.2f} GB/s",
             f"other programs used {figures.others_cores:.2f} cores meanwhile"]
    return "\n".join(lines)
