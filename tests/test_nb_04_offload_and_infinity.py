"""Notebook 04 executed with papermill: the offload ladder, NVMe swap files, stage-3 knobs; the placement the
tensors show compared with what zero_rules predicts from the config."""
import pytest
import torch

from conftest import run_notebook
from course_utils.common import paths, zero_rules
from course_utils.common.record import as_records
from course_utils.common.records.offload import Rung
from course_utils.common.zero_rules import LADDER
from course_utils.kernel.configs import load as load_config
from course_utils.kernel.scale.offload import OFFLOAD_CONFIGS, OFFLOAD_MACHINES, missing
from course_utils.kernel.views.offload import buffer_bytes

NAME = "04_offload_and_infinity"
pytestmark = pytest.mark.notebook


def _held_in(placement: dict, state: str, suffix: str) -> bool:
    """Whether the rung holds ``state`` in a structure whose name ends with ``suffix``."""
    return any(st == state and structure.endswith(suffix) for st, structure in placement["structures"])


def test_ladder_nvme_and_knobs_are_measured():
    m = run_notebook(NAME)
    ladder = {r.name: r for r in as_records(m["ladder"], Rung)}
    assert list(ladder) == ["stage 0", "stage 1", "stage 2", "stage 2 + offload", "stage 3", "stage 3 + offload"]
    assert all(r.step_seconds > 0 and r.phases["forward + backward"] > 0 for r in ladder.values())
    # 16Ψ replicated vs 16Ψ/N plus DeepSpeed's fp32 master copy (20Ψ/N in fp32): measured from the tensors
    assert ladder["stage 0"].model_state_bytes > 1.5 * ladder["stage 3"].model_state_bytes

    placed = {p["name"]: p for p in m["placement"]}
    for name, (stage, zero) in LADDER.items():
        p, moved = placed[name], zero_rules.offloaded(zero)
        # the structures each stage keeps its states in (deepspeed 0.19: stage_1_and_2.py, stage3.py)
        if stage in (1, 2):
            assert _held_in(p, "optimizer", ".single_partition_of_fp32_groups[i]"), (name, p["structures"])
        if stage == 3:
            assert _held_in(p, "params", "module parameter.ds_tensor"), (name, p["structures"])
            assert _held_in(p, "optimizer", ".fp32_partitioned_groups_flat[i]"), (name, p["structures"])
        # measured against the prediction: the states zero_rules sends to the host are the ones DeepSpeed placed
        # on the host side (its own flags and structures), each mostly there
        for state in zero_rules.STATES:
            side = p["by_side"][state]
            assert (side.get("host", 0) > side.get("accelerator", 0)) == (state in moved), (name, state, side, moved)
        assert (p["optimizer"] == "DeepSpeedCPUAdam") == ("optimizer" in moved), name
        if m["is_gpu"]:      # the sides DeepSpeed chose are the tensors' devices: host side on cpu, the rest on cuda
            for state in zero_rules.STATES:
                on = p["by_state"][state]
                assert (on.get("cpu", 0) > sum(on.values()) - on.get("cpu", 0)) == (state in moved), (name, state, on)
    if m["is_gpu"]:
        assert ladder["stage 2 + offload"].host_bytes > 0 and ladder["stage 2"].host_bytes == 0
    else:                # one memory: the tensor walk finds every state on a "cpu" tensor
        assert all(set(on) <= {"cpu"} for p in placed.values() for on in p["by_state"].values()), placed
    # on any machine: each offload rung keeps less on the accelerator side than the rung it extends, NVMe less on the host
    assert [(o["rung"], o["lower"]) for o in m["offload_lowers"]] == [
        ("stage 2 + offload", True), ("stage 3 + offload", True), ("stage 3 + NVMe", True)]
    assert all(r.host_side_bytes == 0 for n, r in ladder.items() if "offload" not in n)
    # DeepSpeed's buffers after backward: stage 3 keeps its reduce bucket on the accelerator side, offload or not
    # (stage3.py, "# IPG"); stages 1-2 have freed theirs (stage_1_and_2.py, _release_ipg_buffers)
    bucket = load_config("zero3.json")[0]["zero_optimization"]["reduce_bucket_size"] * (4 if ladder["stage 3"].dtype == "fp32" else 2)
    assert buffer_bytes(ladder["stage 3"]) == buffer_bytes(ladder["stage 3 + offload"]) == bucket
    assert all(buffer_bytes(ladder[n]) == 0 for n in ("stage 0", "stage 1", "stage 2"))
    if m["ranks"] >= 2:   # the measured order is the formula's; the documented one only from the ranks it needs
        assert m["memory_order_as_formula"] is True
        assert m["memory_order_as_documented"] is (m["ranks"] >= m["formula_crossing_ranks"])
    [nvme] = as_records(m["nvme"], Rung)
    assert m["nvme_swap_files"] >= 2 and nvme.nvme_bytes > 0
    assert not (paths.build_dir() / "nvme" / "04_offload").exists(), "the launch cell removes the swap files it listed"
    staging = sum(b["bytes"] for b in nvme.swap_buffers.values())
    assert staging > 0 and nvme.locked_bytes >= staging, "the swappers' buffers are page-locked host memory"
    assert buffer_bytes(nvme, "host") == staging and buffer_bytes(nvme) == bucket, \
        "both swappers' buffers counted on the host side (the parameter swapper's too), the bucket beside"
    # the parameter swapper's dtype names its folder and sizes its buffers; partition_parameters.py (Init._set_dtype)
    # keeps the dtype passed in only where the accelerator reports fp16 support, else takes bfloat16
    [folder] = m["nvme_param_folders"]
    swap_dtype = folder.removesuffix("params")
    b = nvme.swap_buffers["parameter swapper"]
    assert b["bytes"] // (b["buffers"] * b["elements"]) == getattr(torch, swap_dtype).itemsize, (folder, b)
    if not m["is_gpu"]:
        from deepspeed.accelerator import get_accelerator
        passed = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[nvme.dtype]
        assert swap_dtype == (passed if get_accelerator().is_fp16_supported() else "bfloat16"), (folder, nvme.dtype)
    assert m["client_optimizer_refused"] is True
    assert set(m["optimizer_kernel_seconds"]) == {"DeepSpeedCPUAdam", "AdamW"}
    knobs = {r.name: r for r in as_records(m["knobs"], Rung)}
    assert len(knobs) == 4, "smoke: tight, the question's raise, persist everything, and exercise 2's setting"
    tight = knobs["knobs: tight (live 1e5, reuse 0, prefetch 0)"]
    persist = knobs["knobs: persist everything (threshold 1e7)"]
    assert persist.persistent_numel > 10 * tight.persistent_numel
    raised = knobs["knobs: the question's raise (live 3e10, reuse 1e10)"]
    assert raised.gathered_in_forward >= tight.gathered_in_forward > 0
    assert raised.host_side_bytes == tight.host_side_bytes > 0, "gathering more frees nothing on the host"
    # exercise 2, measured in the ranks: every parameter but the token embedding marked persistent (ds_persist),
    # so forward gathered the embedding alone
    yours = m["persist_all_but_embedding"]
    assert yours["persistent_numel"] == yours["total"] - yours["embedding"] > 0
    assert yours["gathered"] == yours["embedding"]
    assert knobs["knobs: yours (exercise 2)"].persistent_numel == yours["persistent_numel"]
    # real scale: each count formula reproduces the partitions this run's walk found (the formula that disagrees with
    # the measured count by more than the tolerance fails), then projects a Llama-3-8B-shaped step on GPUs
    rows = m["scale_agreement"]
    assert len(rows) == 6 and all(r["within"] for r in rows), [r for r in rows if not r["within"]]
    projections = m["scale_projections"]
    assert [(p["hardware"], p["label"].split(", ", 1)[1]) for p in projections] == [
        (f"{gpus} × {gpu}", config) for gpu, gpus in OFFLOAD_MACHINES for config in OFFLOAD_CONFIGS]
    for p in projections:
        assert missing(p, ("MFU", "link efficiency", "overlap", "host cores per GPU")) == [], p
        terms = {t["name"]: t for t in p["terms"]}
        assert "measured here" in terms["CPU Adam"]["rate_says"]
        assert ("NVMe" in terms) == p["label"].endswith("NVMe") and "offload transfers" in terms


def test_the_kernel_checks_of_the_exercises_pass_the_course_answers_and_name_the_slips():
    """Exercises 1 and 2 judged without a launch: DeepSpeed's config classes read the NVMe config for another folder,
    DeepSpeed's mark_persistent_parameters runs on GPT-2 shapes built on the meta device."""
    import copy

    from course_utils.kernel.views import offload_exercises as oe
    from course_utils.rank.models import tiny_gpt2

    stage3 = load_config("zero3.json")[0]

    def nvme(config, folder, sections=("offload_optimizer", "offload_param"), device="nvme"):
        out = copy.deepcopy(config)
        for section in sections:
            out["zero_optimization"][section] = {"device": device, "nvme_path": folder}
        return out
    assert oe.nvme_problems(nvme, stage3) == ""
    assert "no zero_optimization.offload_param" in oe.nvme_problems(lambda c, f: nvme(c, f, ("offload_optimizer",)), stage3)
    assert "device 'cpu'" in oe.nvme_problems(lambda c, f: nvme(c, f, device="cpu"), stage3)
    assert "elsewhere" in oe.nvme_problems(lambda c, f: nvme(c, "/somewhere/else"), stage3)
    # the section replaced by the offloads, or another stage: the ranks' script would still run stage 3, DeepSpeed not
    replaced = lambda c, f: {**c, "zero_optimization": {s: {"device": "nvme", "nvme_path": f} for s in oe.OFFLOADS}}
    assert "no longer holds the given config's zero_optimization.overlap_comm" in oe.nvme_problems(replaced, stage3)
    assert "ZeRO stage 2" in oe.nvme_problems(lambda c, f: {**nvme(c, f), "zero_optimization": {
        **nvme(c, f)["zero_optimization"], "stage": 2}}, stage3)

    with torch.device("meta"):
        model = tiny_gpt2("zero_lab")

    def below_embedding(m):
        return {"stage3_param_persistence_threshold": sorted(p.numel() for p in m.parameters())[-2]}
    assert oe.persistence_problems(below_embedding, model) == ""
    assert not hasattr(next(model.parameters()), "ds_numel"), "the notebook's model is left as it was"
    assert "embedding is whole" in oe.persistence_problems(
        lambda m: {"stage3_param_persistence_threshold": m.get_input_embeddings().weight.numel()}, model)
    fixed = below_embedding(model)
    assert "still partitioned" in oe.persistence_problems(lambda m: fixed, model)
