"""Notebook 15's exercises, answered wrong on purpose (see tests/answers/__init__.py)."""
from answers import wrong

ANSWERS = {
    "predict_layout": wrong(
        copier=("copies section 1's 4,192 parameters of one expert and the 8,192 bytes section 2's table shows leaving a "
                "rank of the 4-expert model at ep_size 2", """
            def predict_layout(experts, ep_size, world, k, capacity_factor, tokens, hidden, ffn):
                return {"expert_params": experts // ep_size * 4192, "sent_bytes": 8192}
            """),
        misread=[("sizes the all-to-all's buffer by the routes the tokens made (S · k), not by the experts' capacity "
                  "slots", """
            def predict_layout(experts, ep_size, world, k, capacity_factor, tokens, hidden, ffn):
                one_expert = hidden * ffn + ffn + ffn * hidden + hidden
                routes = tokens * k
                return {"expert_params": experts // ep_size * one_expert,
                        "sent_bytes": 2 * routes * hidden * 4 * (ep_size - 1) // ep_size}
            """),
                 ("rounds the capacity to the nearest whole number and leaves DeepSpeed's min_capacity out", """
            def predict_layout(experts, ep_size, world, k, capacity_factor, tokens, hidden, ffn):
                one_expert = hidden * ffn + ffn + ffn * hidden + hidden
                capacity = round(tokens / experts * capacity_factor * k)
                return {"expert_params": experts // ep_size * one_expert,
                        "sent_bytes": 2 * experts * capacity * hidden * 4 * (ep_size - 1) // ep_size}
            """),
                 ("rounds the capacity up but leaves DeepSpeed's min_capacity out", """
            def predict_layout(experts, ep_size, world, k, capacity_factor, tokens, hidden, ffn):
                import math
                one_expert = hidden * ffn + ffn + ffn * hidden + hidden
                capacity = math.ceil(tokens / experts * capacity_factor * k)
                return {"expert_params": experts // ep_size * one_expert,
                        "sent_bytes": 2 * experts * capacity * hidden * 4 * (ep_size - 1) // ep_size}
            """)],
        secret=("9456", "9,456", "18432", "18,432", "6304", "6,304", "6144", "6,144", "12288", "12,288")),
    "moe_zero2": wrong(
        copier=("copies section 2's helper over all the parameters and the config's AdamW, weight decay 0.01 included", """
            def moe_zero2(model):
                import torch
                from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

                groups = split_params_into_different_moe_groups_for_optimizer({"params": list(model.parameters()),
                                                                               "name": "dense"})
                optimizer = torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
                config = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2}}
                return config, optimizer
            """),
        misread=[("gives the experts a group of their own without weight decay, thinking a separate group is all ZeRO "
                 "needs, and does not mark it as an MoE group", """
            def moe_zero2(model):
                import torch
                from deepspeed.moe.utils import is_moe_param

                experts = [p for p in model.parameters() if is_moe_param(p)]
                others = [p for p in model.parameters() if not is_moe_param(p)]
                optimizer = torch.optim.AdamW([{"params": others, "weight_decay": 0.01},
                                               {"params": experts, "weight_decay": 0.0}],
                                              lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
                config = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2}}
                return config, optimizer
            """),
                 ("builds the groups right but reads '4 sequences per rank and step' as the step's whole batch: "
                  "train_batch_size 4, so 2 per rank on 2 ranks", """
            def moe_zero2(model):
                import torch
                from deepspeed.moe.utils import is_moe_param

                experts = [p for p in model.parameters() if is_moe_param(p)]
                others = [p for p in model.parameters() if not is_moe_param(p)]
                groups = [{"params": others, "name": "dense", "weight_decay": 0.01},
                          {"params": experts, "name": experts[0].group_name, "moe": True, "weight_decay": 0.0}]
                optimizer = torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
                return {"train_batch_size": 4, "zero_optimization": {"stage": 2}}, optimizer
            """)],
        run="from_solution", launches=True),
    "leaf_module_section": wrong(
        copier=("copies the section that made the tiny OLMoE train, its own sparse block's class named", """
            def leaf_module_section():
                return {"classes": ["OlmoeSparseMoeBlock"]}
            """),
        misread=[("names the list of experts as the leaf, thinking the experts are what must be gathered together", """
            def leaf_module_section():
                return {"name_suffixes": ["experts"]}
            """),
                 ("names the decoder layer, which holds the sparse block and its attention: it trains, gathering more than "
                  "the block at once", """
            def leaf_module_section():
                return {"classes": ["OlmoeDecoderLayer"]}
            """)],
        secret=("{'classes': ['ExpertListBlock']}", '{"classes": ["ExpertListBlock"]}')),
}
