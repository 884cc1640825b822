"""Notebook 06's exercises, answered wrong on purpose (see tests/answers/__init__.py)."""
from answers import wrong

ANSWERS = {
    "predicted_dtypes": wrong(
        copier=[("copies the measured table's rows, and for the engine it leaves out the nearest row, autocast in bf16", """
            def predicted_dtypes() -> dict:
                return {"fp32": {"module": "float32", "master": "float32", "grad": "float32", "forward": "float32"},
                        "bf16": {"module": "bfloat16", "master": "float32", "grad": "bfloat16", "forward": "bfloat16"},
                        "torch_autocast bf16": {"module": "float32", "master": "float32", "grad": "float32",
                                                "forward": "bfloat16"},
                        "torch_autocast fp16": {"module": "float32", "master": "float32", "grad": "float32",
                                                "forward": "bfloat16"}}
            """),
                ("launched with a first guess (everything fp32), then copies what the engines held into the function "
                 "and runs the check without launching again", """
            def predicted_dtypes() -> dict:
                return {e: {f: dtypes.loc[e, f] for f in ("module", "master", "grad", "forward")} for e in dtypes.index}


            prediction = {e: {f: "float32" for f in ("module", "master", "grad", "forward")} for e in dtypes.index}
            """, "has changed since the launch")],
        misread=("thinks torch_autocast casts the model to its dtype, as the bf16 section does", """
            def predicted_dtypes() -> dict:
                return {"fp32": {"module": "float32", "master": "float32", "grad": "float32", "forward": "float32"},
                        "bf16": {"module": "bfloat16", "master": "float32", "grad": "bfloat16", "forward": "bfloat16"},
                        "torch_autocast bf16": {"module": "bfloat16", "master": "float32", "grad": "bfloat16",
                                                "forward": "bfloat16"},
                        "torch_autocast fp16": {"module": "float16", "master": "float32", "grad": "float16",
                                                "forward": "float16"}}
            """)),
    "target_fp16": wrong(
        copier=("copies the notebook's own fp16 section, printed in section 2, adding the one key it lacks", """
            def target_fp16() -> dict:
                return {**config["fp16"], "consecutive_hysteresis": False}
            """),
        misread=[("takes loss_scale_window for the number of clean steps before a doubling, one too many", """
            def target_fp16() -> dict:
                return {"loss_scale": 0, "initial_scale_power": 12, "loss_scale_window": 5, "hysteresis": 3,
                        "consecutive_hysteresis": True, "min_loss_scale": 1}
            """),
                 ("takes loss_scale for the scale the curve starts at, 2^12, beside the dynamic keys", """
            def target_fp16() -> dict:
                return {"loss_scale": 4096, "initial_scale_power": 12, "loss_scale_window": 4, "hysteresis": 3,
                        "consecutive_hysteresis": True, "min_loss_scale": 1}
            """, "a static LossScaler")],
        secret=("'initial_scale_power': 12", '"initial_scale_power": 12', "'loss_scale_window': 4",
                '"loss_scale_window": 4')),
}
