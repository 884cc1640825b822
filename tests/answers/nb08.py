"""Notebook 08's exercises, answered wrong on purpose (see tests/answers/__init__.py)."""
from answers import wrong

ANSWERS = {
    "predict_auto": wrong(
        copier=("copies the 'received by DeepSpeed' column of the resolution table, value by value", """
            def predict_auto(settings: dict, world_size: int, hidden_size: int) -> dict:
                return {"fp16.enabled": False, "bf16.enabled": False, "optimizer.params.lr": 0.001,
                        "optimizer.params.betas": [0.9, 0.999], "optimizer.params.eps": 1e-08,
                        "optimizer.params.weight_decay": 0.01, "scheduler.params.warmup_min_lr": 0,
                        "scheduler.params.warmup_max_lr": 0.001, "scheduler.params.warmup_num_steps": 1,
                        "scheduler.params.total_num_steps": 4, "zero_optimization.reduce_bucket_size": 1024,
                        "gradient_accumulation_steps": 2, "gradient_clipping": 1.0, "train_batch_size": 16,
                        "train_micro_batch_size_per_gpu": 4}
            """),
        misread=("counts train_batch_size for one rank and takes the bucket size for the hidden size itself", """
            def predict_auto(settings: dict, world_size: int, hidden_size: int) -> dict:
                lr = settings["learning_rate"]
                return {"fp16.enabled": False, "bf16.enabled": False, "optimizer.params.lr": lr,
                        "optimizer.params.betas": [0.9, 0.999], "optimizer.params.eps": 1e-8,
                        "optimizer.params.weight_decay": settings["weight_decay"],
                        "scheduler.params.warmup_min_lr": 0, "scheduler.params.warmup_max_lr": lr,
                        "scheduler.params.warmup_num_steps": settings["warmup_steps"],
                        "scheduler.params.total_num_steps": settings["max_steps"],
                        "zero_optimization.reduce_bucket_size": hidden_size,
                        "gradient_accumulation_steps": settings["gradient_accumulation_steps"],
                        "gradient_clipping": settings["max_grad_norm"],
                        "train_micro_batch_size_per_gpu": settings["per_device_train_batch_size"],
                        "train_batch_size": settings["per_device_train_batch_size"] * settings["gradient_accumulation_steps"]}
            """),
        secret=("'train_batch_size': 24", '"train_batch_size": 24', "'zero_optimization.reduce_bucket_size': 2304",
                '"reduce_bucket_size": 2304')),
    "part3_fixed": wrong(
        copier=("follows the error message's own advice and sets all three disagreeing values to \"auto\"", """
            def part3_fixed(config: dict) -> tuple:
                config = json.loads(json.dumps(config))          # a copy: part 3's config stays as it was
                config["optimizer"]["params"]["lr"] = "auto"
                config["optimizer"]["params"]["betas"] = "auto"
                config["scheduler"]["params"]["warmup_num_steps"] = "auto"
                return config, {}
            """),
        misread=[("thinks the config's values win over the arguments, so keeping them needs nothing on the Trainer's side", """
            def part3_fixed(config: dict) -> tuple:
                config = json.loads(json.dumps(config))          # a copy: part 3's config stays as it was
                config["optimizer"]["params"]["lr"] = "auto"
                config["scheduler"]["params"]["warmup_num_steps"] = "auto"
                return config, {}
            """),
                 ("hands the Trainer the config's key name, betas, as if TrainingArguments had such a field", """
            def part3_fixed(config: dict) -> tuple:
                config = json.loads(json.dumps(config))          # a copy: part 3's config stays as it was
                config["optimizer"]["params"]["lr"] = "auto"
                config["scheduler"]["params"]["warmup_num_steps"] = "auto"
                return config, {"betas": [0.9, 0.95]}
            """),
                 ("thinks the scheduler section is what disagrees, and takes it out with the learning rate", """
            def part3_fixed(config: dict) -> tuple:
                config = json.loads(json.dumps(config))          # a copy: part 3's config stays as it was
                del config["scheduler"]
                del config["optimizer"]["params"]["lr"]
                return config, {}
            """, "your config no longer has")],
        secret=("'adam_beta2': 0.95", '"adam_beta2": 0.95')),
}
