"""Notebook 13's exercises, answered wrong on purpose (see tests/answers/__init__.py)."""
from answers import wrong

ANSWERS = {
    "predict_bubble": wrong(
        copier=[("copies the page's bubble formula with section 2's rule that a step of m micro-batches is m·b samples: "
                 "the replicas of the 4-rank launch left out", """
            def predict_bubble(config: dict, world_size: int, stages: int) -> float:
                m = config["train_batch_size"] // config["train_micro_batch_size_per_gpu"]
                return (stages - 1) / (m + stages - 1)
            """),
                ("copies notebook 02's rule, micro-batch × accumulation × world size, with every rank counted as a "
                 "data-parallel one", """
            def predict_bubble(config: dict, world_size: int, stages: int) -> float:
                m = config["train_batch_size"] / (config["train_micro_batch_size_per_gpu"] * world_size)
                return (stages - 1) / (m + stages - 1)
            """)],
        misread=("takes the bubble as the fill and the drain over the micro-batches alone, (p − 1)/m, forgetting that "
                 "the window holds them too", """
            def predict_bubble(config: dict, world_size: int, stages: int) -> float:
                m = config["train_batch_size"] // (config["train_micro_batch_size_per_gpu"] * (world_size // stages))
                return (stages - 1) / m
            """),
        secret=("2/14", "2/8", "0.143", "0.250")),
    "build_pipeline": wrong(
        copier=("copies the PipelineModule call section 2 quotes, with its default \"uniform\": the same number of "
                "layers on each stage", """
            def build_pipeline(layers, num_stages, loss_fn):
                from deepspeed.pipe import PipelineModule
                return PipelineModule(layers=layers, num_stages=num_stages, loss_fn=loss_fn, partition_method="uniform")
            """),
        misread=[("balances the Linear layers with \"type:Linear\", as if each Linear held as many parameters", """
            def build_pipeline(layers, num_stages, loss_fn):
                from deepspeed.pipe import PipelineModule
                return PipelineModule(layers=layers, num_stages=num_stages, loss_fn=loss_fn,
                                      partition_method="type:Linear")
            """),
                 ("thinks a stage may take any layers, and moves the large ones so that \"uniform\" balances them", """
            def build_pipeline(layers, num_stages, loss_fn):
                from deepspeed.pipe import PipelineModule
                return PipelineModule(layers=[layers[0], *layers[3:], layers[1], layers[2]], num_stages=num_stages,
                                      loss_fn=loss_fn, partition_method="uniform")
            """, "in their order")],
        launches=True),
}
