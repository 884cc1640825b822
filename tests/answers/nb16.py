"""Notebook 16's exercises, answered wrong on purpose (see tests/answers/__init__.py)."""
from answers import wrong

ANSWERS = {
    "predict_placement": wrong(
        copier=("copies the first size's row of section 2's sizes table (11 M), its 16 bytes a parameter, as all on "
                "the host side and nothing on the accelerator side", """
            def predict_placement() -> dict:
                return {"accelerator_side_mib": 0, "host_side_mib": 165.66}
            """),
        misread=("thinks the gradients stay with the module on the device and only the master weights and Adam's "
                 "moments go to the host", """
            def predict_placement() -> dict:
                psi = bigger.parameters(OFFLOAD_SIZES[0])
                return {"accelerator_side_mib": 8 * psi / MiB, "host_side_mib": 12 * psi / MiB}
            """),
        secret=("41.4", "43.7", "167.9")),
    "nvme_keys": wrong(
        copier=("copies the CPU offload configuration's two sections printed in section 2, the device switched to nvme "
                "and the folder added", """
            def nvme_keys(folder: str, largest_param: int) -> dict:
                return {"offload_optimizer": {"device": "nvme", "nvme_path": folder, "pin_memory": False},
                        "offload_param": {"device": "nvme", "nvme_path": folder, "pin_memory": False}}
            """),
        misread=("keeps no parameter in host memory but makes the staging buffers smaller than a parameter, thinking "
                 "the swapper streams a parameter through them piece by piece", """
            def nvme_keys(folder: str, largest_param: int) -> dict:
                swap = {"device": "nvme", "nvme_path": folder, "pin_memory": False}
                return {"offload_optimizer": dict(swap),
                        "offload_param": {**swap, "max_in_cpu": 0, "buffer_count": 5, "buffer_size": 100_000}}
            """),
        run="from_solution", launches=True),
    "my_projection": wrong(
        copier=[("copies section 5's call for the 8 B model and takes its ZeRO-2 + offload_optimizer row", """
            def my_projection() -> dict:
                rows, real = one_gpu.eight_b_on_24gb(figures.cpu_adam_s_per_param_core)
                zero2 = next(r for r in rows if r["configuration"] == "ZeRO-2 + offload_optimizer")
                return {"device_gb": zero2["model states on the GPU GB"], "step_seconds": zero2["projected s/step"]}
            """),
                ("calls the projection function behind section 5's table, under another name, for the team's case", """
            def my_projection() -> dict:
                from course_utils.kernel.scale.project import step as count_it
                p = count_it(one_gpu.models.size("GPT-2 XL"), "A100 40 GB", 8, stage=2, tokens_per_gpu=8 * 1024,
                             mfu=0.45)
                return {"device_gb": p.memory["device"] / 1e9, "step_seconds": p.seconds}
            """)],
        misread=[("thinks ZeRO-2 divides the 16-bit parameters over the GPUs too (16Ψ/N, stage 3's figure)", """
            def my_projection() -> dict:
                xl = one_gpu.models.size("GPT-2 XL")
                psi, n, tokens = xl.params, 8, 8 * 1024
                forward = 2 * xl.matmul_params * tokens + 4 * xl.layers * xl.tokens_per_sample * xl.hidden * tokens
                return {"device_gb": 16 * psi / n / 1e9,
                        "step_seconds": max(3 * forward / (312e12 * 0.45), 3 * (n - 1) / n * psi * 2 / (300e9 * 0.8))}
            """),
                 ("counts the 16-bit gradients whole beside the parameters (2Ψ + 2Ψ + 12Ψ/N read as 2Ψ + 16Ψ/N) and "
                  "leaves attention out of the FLOPs: each 7-9 % off, inside a loose tolerance", """
            def my_projection() -> dict:
                xl = one_gpu.models.size("GPT-2 XL")
                psi, n, tokens = xl.params, 8, 8 * 1024
                return {"device_gb": (2 * psi + 16 * psi / n) / 1e9,
                        "step_seconds": 3 * 2 * xl.matmul_params * tokens / (312e12 * 0.45)}
            """),
                 ("writes the bytes in GiB where the exercise asks for GB (10⁹ bytes)", """
            def my_projection() -> dict:
                xl = one_gpu.models.size("GPT-2 XL")
                psi, n, tokens = xl.params, 8, 8 * 1024
                forward = 2 * xl.matmul_params * tokens + 4 * xl.layers * xl.tokens_per_sample * xl.hidden * tokens
                return {"device_gb": (2 * psi + 14 * psi / n) / 2**30,
                        "step_seconds": max(3 * forward / (312e12 * 0.45), 3 * (n - 1) / n * psi * 2 / (300e9 * 0.8))}
            """)],
        secret=("5.84", "0.5998", "0.600")),
}
