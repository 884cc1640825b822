"""Notebook 10's exercises, answered wrong on purpose (see tests/answers/__init__.py)."""
from answers import wrong

ANSWERS = {
    "predict_run": wrong(
        copier=("copies the steps the run printed (\"after 64 steps\" on the smoke run's page) and takes the global batch "
                "as the exercise words it", """
            def predict_run(examples: int, epochs: int, world_size: int, per_device_batch: int) -> dict:
                return {"train_batch_size": per_device_batch * world_size, "steps": 64}
            """),
        misread=[("thinks every rank steps through the whole training split, as if each computed every batch", """
            def predict_run(examples: int, epochs: int, world_size: int, per_device_batch: int) -> dict:
                return {"train_batch_size": per_device_batch, "steps": math.ceil(examples / per_device_batch) * epochs}
            """),
                 ("thinks the last batch of an epoch, which is not full, is dropped", """
            def predict_run(examples: int, epochs: int, world_size: int, per_device_batch: int) -> dict:
                global_batch = per_device_batch * world_size
                return {"train_batch_size": global_batch, "steps": examples // global_batch * epochs}
            """)],
        secret=("'steps': 64", "'train_batch_size': 64")),
    "zero3_config": wrong(
        copier=("loads the course's ZeRO-3 file, the fallback the launch cell names", """
            def zero3_config(z2: dict) -> dict:
                return cu.configs.load("10_zero3_offload.json")[0]
            """),
        misread=[("keeps stage 2 and adds the parameter offload and the gather, taking the offload for what partitions "
                  "the parameters", """
            def zero3_config(z2: dict) -> dict:
                config = json.loads(json.dumps(z2))
                config["zero_optimization"].update(offload_param={"device": "cpu", "pin_memory": False},
                                                   stage3_gather_16bit_weights_on_model_save=True)
                return config
            """),
                 ("thinks save_model gathers a ZeRO-3 model by itself, so leaves the gather out", """
            def zero3_config(z2: dict) -> dict:
                config = json.loads(json.dumps(z2))
                config["zero_optimization"].update(stage=3, offload_param={"device": "cpu", "pin_memory": False})
                return config
            """),
                 ("thinks the ZeRO-3 sizes have defaults that fit any model, and leaves them out", """
            def zero3_config(z2: dict) -> dict:
                config = json.loads(json.dumps(z2))
                zero = config["zero_optimization"]
                for stage2_only in ("reduce_scatter", "allgather_partitions", "allgather_bucket_size"):
                    zero.pop(stage2_only, None)
                zero.update(stage=3, offload_param={"device": "cpu", "pin_memory": False},
                            stage3_gather_16bit_weights_on_model_save=True)
                return config
            """, "to the Trainer")],
        run="from_solution", secret=("stage3_gather_16bit_weights_on_model_save", "offload_param")),
}
