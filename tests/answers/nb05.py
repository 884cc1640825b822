"""Notebook 05's exercises, answered wrong on purpose (see tests/answers/__init__.py)."""
from answers import wrong

ANSWERS = {
    "bucket_bytes": wrong(
        copier=[("copies the line above the exercise: 4 bytes per reduce_bucket_size element, whatever the case", """
            def bucket_bytes(stage: int, dtype: str, reduce_bucket_size: float, allgather_bucket_size: float,
                             overlap_comm: bool, contiguous_gradients: bool) -> float:
                per_element = overlap.buffer_bytes / overlap.reduce_bucket_size      # measured: 2 buckets × 2 bytes
                return per_element * reduce_bucket_size
            """),
                ("calls the course's 4.5x rule of thumb that the table prints beside the measured bytes", """
            def bucket_bytes(stage: int, dtype: str, reduce_bucket_size: float, allgather_bucket_size: float,
                             overlap_comm: bool, contiguous_gradients: bool) -> float:
                return planning.overlap_comm_bucket_bytes(reduce_bucket_size, allgather_bucket_size)
            """),
                ("looks each case up among the engines the launch built, which the kernel holds", """
            def bucket_bytes(stage: int, dtype: str, reduce_bucket_size: float, allgather_bucket_size: float,
                             overlap_comm: bool, contiguous_gradients: bool) -> float:
                for b in held_out:
                    if (b.stage, b.dtype, b.reduce_bucket_size, b.overlap_comm, b.contiguous_gradients) == (
                            stage, dtype, reduce_bucket_size, overlap_comm, contiguous_gradients):
                        return b.buffer_bytes
            """, "looked up `held_out`")],
        misread=[("thinks overlap_comm double-buffers the bucket at every stage, stage 3 included", """
            def bucket_bytes(stage: int, dtype: str, reduce_bucket_size: float, allgather_bucket_size: float,
                             overlap_comm: bool, contiguous_gradients: bool) -> float:
                if not contiguous_gradients:
                    return 0
                element = {"bf16": 2, "fp16": 2, "fp32": 4}[dtype]
                return (2 if overlap_comm else 1) * reduce_bucket_size * element
            """),
                 ("thinks stage 1, which partitions only the optimizer states, needs no gradient bucket", """
            def bucket_bytes(stage: int, dtype: str, reduce_bucket_size: float, allgather_bucket_size: float,
                             overlap_comm: bool, contiguous_gradients: bool) -> float:
                if not contiguous_gradients or stage == 1:
                    return 0
                element = {"bf16": 2, "fp16": 2, "fp32": 4}[dtype]
                return (2 if overlap_comm and stage == 2 else 1) * reduce_bucket_size * element
            """),
                 ("thinks a gradient bucket always holds fp32 values, whatever the training dtype", """
            def bucket_bytes(stage: int, dtype: str, reduce_bucket_size: float, allgather_bucket_size: float,
                             overlap_comm: bool, contiguous_gradients: bool) -> float:
                if not contiguous_gradients:
                    return 0
                return (2 if overlap_comm and stage < 3 else 1) * reduce_bucket_size * 4
            """)],
        secret=("24000000", "12000000", "6000000")),
    "plan_config": wrong(
        copier=("asks the course's ladder for the colleague's machine and writes its rung and micro-batch as they come", """
            def plan_config() -> dict:
                plan = planning.first_fit(work, planning.Machine(gpu_gb=24, gpus=2, cpu_gb=256))
                return {"train_batch_size": 64, "train_micro_batch_size_per_gpu": plan["micro_batch"],
                        "bf16": {"enabled": True},
                        "zero_optimization": {"stage": plan["stage"], "offload_optimizer": {"device": "cpu"}}}
            """),
        misread=[("thinks two GPUs halve every model state, so ZeRO-2 without offload now fits", """
            def plan_config() -> dict:
                return {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4, "bf16": {"enabled": True},
                        "zero_optimization": {"stage": 2}}
            """),
                 ("thinks offloading the optimizer makes the lowest stage enough, and offloads at stage 1", """
            def plan_config() -> dict:
                return {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 8, "bf16": {"enabled": True},
                        "zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}}}
            """, "offloads the optimizer at stage 1"),
                 ("thinks offload_param also moves the parameters off the GPU at stage 2", """
            def plan_config() -> dict:
                return {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4, "bf16": {"enabled": True},
                        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"},
                                              "offload_param": {"device": "cpu"}}}
            """, "where DeepSpeed ignores it")],
        secret=("offload_optimizer True, offload_param False, NVMe False; micro-batch 4 × 8",)),
}
