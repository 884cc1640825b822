"""Notebook 03's exercises, answered wrong on purpose (see tests/answers/__init__.py)."""
from answers import wrong

ANSWERS = {
    "predict_stage3": wrong(
        copier=[("copies the four numbers section 6's table printed for the weight the ranks followed", """
            def predict_stage3(shape: tuple, world_size: int) -> dict:
                return {"shard": 294912, "outside": 0, "inside": 589824, "after": 0}
            """),
                ("works the shard out but copies the whole weight's count the table printed for \"inside\"", """
            def predict_stage3(shape: tuple, world_size: int) -> dict:
                import math
                return {"shard": math.ceil(math.prod(shape) / world_size), "outside": 0, "inside": 589824, "after": 0}
            """)],
        misread=[("thinks the gathered weight stays whole once the GatheredParameters block has ended", """
            def predict_stage3(shape: tuple, world_size: int) -> dict:
                numel = 1
                for n in shape:
                    numel *= n
                return {"shard": -(-numel // world_size), "outside": 0, "inside": numel, "after": numel}
            """),
                 ("cuts the weight into equal slices and drops the remainder, as Ψ/N reads", """
            def predict_stage3(shape: tuple, world_size: int) -> dict:
                numel = 1
                for n in shape:
                    numel *= n
                return {"shard": numel // world_size, "outside": 0, "inside": numel, "after": 0}
            """),
                 ("thinks the gather hands back every rank's shard, padding included: shard × ranks", """
            def predict_stage3(shape: tuple, world_size: int) -> dict:
                numel = 1
                for n in shape:
                    numel *= n
                shard = -(-numel // world_size)
                return {"shard": shard, "outside": 0, "inside": shard * world_size, "after": 0}
            """)],
        secret=("294912", "589824")),
    "read_whole": wrong(
        copier=("copies section 6's plain read, which reads each parameter as PyTorch does", """
            def read_whole(params: dict) -> dict:
                import deepspeed
                return {name: (tuple(p.shape), float(p.detach().norm())) for name, p in params.items()}
            """),
        misread=("gathers the parameters, then reads them after the block, as if the gather left them whole", """
            def read_whole(params: dict) -> dict:
                import deepspeed
                with deepspeed.zero.GatheredParameters(list(params.values())):
                    kept = dict(params)
                return {name: (tuple(p.shape), float(p.detach().norm())) for name, p in kept.items()}
            """)),
    "budget_plan": wrong(
        copier=("takes stage 3 and the 66.31 MiB the check printed for rank 0 on 4 ranks", """
            def budget_plan(base: dict, psi: int, n: int) -> tuple:
                config = json.loads(json.dumps(base))
                config["zero_optimization"]["stage"] = 3
                predicted = 66.31 * 2**20
                return config, predicted
            """),
        misread=[("plans with the paper's fp32 column (16Ψ, 8Ψ + 8Ψ/N, 4Ψ + 12Ψ/N, 16Ψ/N), not what DeepSpeed holds", """
            def budget_plan(base: dict, psi: int, n: int) -> tuple:
                config = json.loads(json.dumps(base))
                paper = {0: 16, 1: 8 + 8 / n, 2: 4 + 12 / n, 3: 16 / n}
                stage = next(s for s in range(4) if paper[s] <= 0.36 * 16)
                config["zero_optimization"]["stage"] = stage
                predicted = paper[stage] * psi
                return config, predicted
            """),
                 ("counts what DeepSpeed holds but rank 0's gradients as Ψ/N, the average over the ranks, where its buffer "
                  "holds the parameters that touch its partition whole (section 3 c)", """
            def budget_plan(base: dict, psi: int, n: int) -> tuple:
                config = json.loads(json.dumps(base))
                held = {0: 16, 1: 4 + 16 / n, 2: 4 + 16 / n, 3: 20 / n}
                stage = next(s for s in range(4) if held[s] <= 0.36 * 16)
                config["zero_optimization"]["stage"] = stage
                return config, held[stage] * psi
            """)],
        secret=("66.31 MiB", "66.01 MiB")),
}
