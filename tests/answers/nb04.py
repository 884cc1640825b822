"""Notebook 04's exercises, answered wrong on purpose (see tests/answers/__init__.py)."""
from answers import wrong

ANSWERS = {
    "with_nvme": wrong(
        copier=[("copies the keys section 1 prints for the stage 3 + offload rung", """
            def with_nvme(config: dict, folder: str) -> dict:
                out = copy.deepcopy(config)
                out["zero_optimization"].update({"offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}})
                return out
            """),
                ("copies the offload keys from the launch command the ladder cell printed, folder and all", """
            def with_nvme(config: dict, folder: str) -> dict:
                out = copy.deepcopy(config)
                printed = "/work/main/build/nvme/04_offload"
                out["zero_optimization"]["offload_optimizer"] = {"device": "nvme", "nvme_path": printed}
                out["zero_optimization"]["offload_param"] = {"device": "nvme", "nvme_path": printed}
                return out
            """)],
        misread=[("thinks ZeRO-Infinity moves only the optimizer states to NVMe, so sets offload_optimizer alone", """
            def with_nvme(config: dict, folder: str) -> dict:
                out = copy.deepcopy(config)
                out["zero_optimization"]["offload_optimizer"] = {"device": "nvme", "nvme_path": folder}
                return out
            """),
                 ("thinks the NVMe keys are the whole zero_optimization section, and replaces it with them", """
            def with_nvme(config: dict, folder: str) -> dict:
                out = copy.deepcopy(config)
                out["zero_optimization"] = {"offload_optimizer": {"device": "nvme", "nvme_path": folder},
                                            "offload_param": {"device": "nvme", "nvme_path": folder}}
                return out
            """, "no longer holds the given config's"),
                 ("thinks offloading is stage 2's business, and sets stage 2 with both offloads on NVMe", """
            def with_nvme(config: dict, folder: str) -> dict:
                out = copy.deepcopy(config)
                out["zero_optimization"].update({"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": folder},
                                                 "offload_param": {"device": "nvme", "nvme_path": folder}})
                return out
            """, "ZeRO stage 2")]),
    "all_but_embedding": wrong(
        copier=[("copies the threshold the check printed for the course model on this machine", """
            def all_but_embedding(model) -> dict:
                return {"stage3_param_persistence_threshold": 589824}
            """),
                ("copies the 'persist everything' setting of section 5's knobs", """
            def all_but_embedding(model) -> dict:
                return {"stage3_param_persistence_threshold": 1e7}
            """)],
        misread=("sets the threshold to the embedding's size, reading \"at most\" as \"below\"", """
            def all_but_embedding(model) -> dict:
                return {"stage3_param_persistence_threshold": model.get_input_embeddings().weight.numel()}
            """),
        secret=("589824",)),
}
