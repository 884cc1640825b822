"""Notebook 07's exercises, answered wrong on purpose (see tests/answers/__init__.py)."""
from answers import wrong

ANSWERS = {
    "predicted_adam_classes": wrong(
        copier=[("copies the classes the table shows for the nearest sections, those with the default adam_w_mode", """
            def predicted_adam_classes() -> dict:
                return {(False, False): "FusedAdam", (True, False): "AdamW",
                        (False, True): "DeepSpeedCPUAdam", (True, True): "AdamW"}
            """),
                ("launched with a first guess, then copies the classes the engines built into the function and runs "
                 "the check without launching again", """
            def predicted_adam_classes() -> dict:
                return {case: measured.get(label) for case, label in ADAM_CASES.items()}


            prediction = {case: "FusedAdam" for case in ADAM_CASES}
            """, "has changed since the launch")],
        misread=("thinks offload is decided first, so every offloaded Adam becomes DeepSpeedCPUAdam", """
            def predicted_adam_classes() -> dict:
                return {(False, False): "FusedAdam", (True, False): "Adam",
                        (False, True): "DeepSpeedCPUAdam", (True, True): "DeepSpeedCPUAdam"}
            """)),
    "linear_like_hf": wrong(
        copier=[("hands in the course's own WarmupDecayLR section, the one section 2 plotted", """
            def linear_like_hf(steps: int, warmup: int, lr: float) -> dict:
                from course_utils.rank.optimizers import scheduler_sections
                return scheduler_sections(steps, warmup, lr)["WarmupDecayLR (log)"]


            def lag_behind_hf() -> int:
                return 1
            """),
                ("copies the WarmupDecayLR section of the Trainer's config printed in section 4, \"auto\" values and all", """
            def linear_like_hf(steps: int, warmup: int, lr: float) -> dict:
                return cu.configs.load("07_trainer_base.json")[0]["scheduler"]


            def lag_behind_hf() -> int:
                return 1
            """)],
        misread=[("thinks WarmupDecayLR decays over the whole run by itself, and leaves total_num_steps out", """
            def linear_like_hf(steps: int, warmup: int, lr: float) -> dict:
                return {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": lr,
                                                            "warmup_num_steps": warmup, "warmup_type": "linear"}}


            def lag_behind_hf() -> int:
                return 1
            """),
                 ("counts the two steps DeepSpeed's warm-up spends at its minimum as the lag, forgetting HF's own first step at 0", """
            def linear_like_hf(steps: int, warmup: int, lr: float) -> dict:
                return {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": lr,
                                                            "warmup_num_steps": warmup, "total_num_steps": steps,
                                                            "warmup_type": "linear"}}


            def lag_behind_hf() -> int:
                return 2
            """)],
        run="from_solution", launches=True),
}
