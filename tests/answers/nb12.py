"""Notebook 12's exercises, answered wrong on purpose (see tests/answers/__init__.py)."""
from answers import wrong

ANSWERS = {
    "predict_model_states": wrong(
        copier=[("copies section 1's peft count (its call, with the colleague's r and targets) into the course's "
                 "formula at stage 3, which leaves P at 0: the page never counts P", """
            def predict_model_states(model, r: int, targets: list, world_size: int) -> float:
                trainable, total = adapters.with_lora(model, r, targets).get_nb_trainable_parameters()
                return adapters.expected_bytes(total, trainable, 3, world_size)["model_states"]
            """),
                ("copies the stage-3 LoRA row the table printed (224.5 + 8 + 24 KiB), the course's adapter instead "
                 "of the colleague's", """
            def predict_model_states(model, r: int, targets: list, world_size: int) -> float:
                return (224.5 + 8.0 + 24.0) * 1024
            """)],
        misread=[("thinks stage 3 partitions only what trains: the frozen base stays whole on every rank", """
            def predict_model_states(model, r: int, targets: list, world_size: int) -> float:
                base = sum(p.numel() for p in model.parameters())
                adapter = sum(r * sum(m.weight.shape) for name, m in model.named_modules()
                              if name.split(".")[-1] in targets)
                return 4 * base + (4 + 4 + 12) * adapter / world_size
            """),
                 ("counts as persistent only the adapter's small tensors, as if the base's biases and layer norms "
                  "were partitioned like its large weights", """
            def predict_model_states(model, r: int, targets: list, world_size: int) -> float:
                adapter = [n for name, m in model.named_modules() if name.split(".")[-1] in targets
                           for n in (r * m.weight.shape[0], m.weight.shape[1] * r)]
                total = sum(p.numel() for p in model.parameters()) + sum(adapter)
                whole = sum(n for n in adapter if n <= 640)
                return 4 * total / world_size + 4 * whole + 16 * sum(adapter) / world_size
            """)],
        secret=("287,232", "280.5 KiB")),
    "adapter_state": wrong(
        copier=("copies the report's version the exercise quotes: the state dict read outside any gather", """
            def adapter_state(model) -> dict:
                import deepspeed
                from peft import get_peft_model_state_dict
                return get_peft_model_state_dict(model)
            """),
        misread=[("gathers on every rank, then reads the state dict after the block, as if the gather lasted", """
            def adapter_state(model) -> dict:
                import deepspeed
                from peft import get_peft_model_state_dict
                adapter = [p for p in model.parameters() if p.requires_grad]
                with deepspeed.zero.GatheredParameters(adapter, modifier_rank=None):
                    pass
                return get_peft_model_state_dict(model)
            """),
                 ("gathers only lora_B, the matrices the report's file showed empty, as if lora_A were never partitioned", """
            def adapter_state(model) -> dict:
                import deepspeed
                from peft import get_peft_model_state_dict
                lora_b = [p for n, p in model.named_parameters() if "lora_B" in n]
                with deepspeed.zero.GatheredParameters(lora_b, modifier_rank=None):
                    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}
            """, "empty or not of the adapter's full shape")],
        launches=True),
}
