"""Fast unit tests of the memory accounting, the ZeRO formulas, the estimator wrappers and the OOM ladder."""
import pytest
import torch

from course_utils.kernel import planning
from course_utils.rank import memory
from course_utils.common import zero_rules


def test_paper_example_reproduced():
    gb = zero_rules.paper_example(7.5e9, 64)
    assert gb["0"] == pytest.approx(120.0)
    assert gb["1"] == pytest.approx(31.4, abs=0.01)
    assert gb["2"] == pytest.approx(16.6, abs=0.05)
    assert gb["3"] == pytest.approx(1.875)


@pytest.mark.parametrize("stage,expected", [(0, 16), (1, 8 + 8 / 4), (2, 4 + 12 / 4), (3, 16 / 4)])
def test_fp32_formula(stage, expected):
    assert zero_rules.zero_formula(1000, stage, 4, "fp32")["total"] == pytest.approx(expected * 1000)


def test_formula_rejects_bad_input():
    with pytest.raises(ValueError, match="stage"):
        zero_rules.zero_formula(10, 4, 2)
    with pytest.raises(ValueError, match="dtype"):
        zero_rules.zero_formula(10, 1, 2, "int8")


def test_adjustments_only_where_deepspeed_differs():
    psi, n = 1_000_000, 2
    assert zero_rules.deepspeed_expected(psi, 0, n, "bf16")["total"] == zero_rules.zero_formula(psi, 0, n)["total"]
    fp32_s3 = zero_rules.deepspeed_expected(psi, 3, n, "fp32", persistent_numel=100)
    assert fp32_s3["optimizer"] == pytest.approx(12 * psi / n)      # fp32 master copy on top of the moments
    assert fp32_s3["params"] == pytest.approx(4 * psi / n + 400)    # persistent params stay whole
    s1 = zero_rules.deepspeed_expected(psi, 1, n, "bf16", grad_partition_numel=520_000)
    assert s1["grads"] == 2 * 520_000                              # stage 1 partitions grads at the boundary


class _Engine:
    """Just enough of an engine for the tensor walk: a module and an optimizer with views and state."""

    def __init__(self):
        self.module = torch.nn.Linear(4, 4, bias=False)
        flat = torch.zeros(16)
        self.module.weight.data = flat.view(4, 4)             # the parameter is a view into a flat buffer
        self.module.weight.grad = torch.zeros(4, 4)
        master = torch.zeros(8, dtype=torch.float64)
        self.optimizer = type("Opt", (), {})()
        self.optimizer.bit16_groups_flat = [flat]
        self.optimizer.single_partition_of_fp32_groups = [master]
        self.optimizer.state = {"p": {"exp_avg": torch.zeros(8), "exp_avg_sq": torch.zeros(8)}}
        self.optimizer.ipg_bucket_buffer = torch.zeros(100)
        self.optimizer.__class__.__module__ = "deepspeed.fake"


def test_inventory_counts_each_storage_once_and_sorts_it():
    bytes_ = memory.model_state_bytes(memory.tensor_inventory(_Engine()))
    assert bytes_["params"] == 16 * 4                # flat buffer once, not again for the view
    assert bytes_["grads"] == 16 * 4
    assert bytes_["optimizer"] == 8 * 8 + 2 * 8 * 4  # fp64 master + two moments
    assert bytes_["buffers"] == 100 * 4
    assert bytes_["model_states"] == bytes_["params"] + bytes_["grads"] + bytes_["optimizer"]


def test_bucket_rule():
    assert planning.overlap_comm_bucket_bytes(5e8, 5e8) == pytest.approx(9e9)
    assert planning.overlap_comm_bucket_bytes(2e8, 2e8) == pytest.approx(3.6e9)


def test_estimator_rows_match_deepspeed_formulas():
    rows = planning.estimator_rows(int(1e9), int(1e8), gpus_per_node=8)
    s2 = next(r for r in rows if r["stage"] == 2 and not r["offload_optimizer"])
    assert s2["gpu_bytes"] == 2 * 1e9 + int(18 * 1e9 / 8)
    s3 = next(r for r in rows if r["stage"] == 3 and not r["offload_optimizer"] and r["zero_init"])
    assert s3["gpu_bytes"] == 4 * 1e8 + int(18 * 1e9 / 8)
    assert len(rows) == 8


def test_oom_ladder_picks_the_first_rung_that_fits():
    work = planning.Workload(params=6.7e9, largest_layer=1.3e8, act_gb_per_sample=6, ckpt_act_gb_per_sample=1.5)
    big = planning.first_fit(work, planning.Machine(gpu_gb=80, gpus=8, cpu_gb=1000))
    assert big["rung"] == "ZeRO stage 2" and big["micro_batch"] > 1
    small = planning.first_fit(work, planning.Machine(gpu_gb=24, gpus=1, cpu_gb=256))
    assert small["rung"] == "ZeRO stage 2 + offload_optimizer"
    nvme = planning.first_fit(work, planning.Machine(gpu_gb=24, gpus=1, cpu_gb=64, nvme_gb=2000))
    assert nvme["rung"] == "ZeRO-Infinity: offload to NVMe"
    assert [t["fits"] for t in nvme["tried"]][-1] and not any(t["fits"] for t in nvme["tried"][:-1])
    none = planning.first_fit(work, planning.Machine(gpu_gb=8, gpus=1, cpu_gb=16))
    assert none["rung"] is None


def test_calculator_splits_offloaded_states():
    parts = planning.per_rank_bytes(7.5, 64, 3, "optimizer", "bf16")
    assert parts["optimizer"]["device"] == 0 and parts["optimizer"]["host"] == pytest.approx(7.5 * 12 / 64)
    assert parts["grads"]["device"] == 0 and parts["grads"]["host"] == pytest.approx(7.5 * 2 / 64)
    assert parts["params"]["device"] == pytest.approx(7.5 * 2 / 64)
    widget, update = planning.calculator()
    update()


def test_calculator_opens_on_the_papers_case():
    """A FloatLogSlider snapped 7.5 to its grid (10**0.9 = 7.94): the calculator must show 7.5 B exactly."""
    widget, _ = planning.calculator()
    params_b, ranks, stage = (c.value for c in widget.children[:3])
    assert params_b * 1e9 == 7.5e9 and ranks == 64 and stage == 3


def test_calculator_redraws_its_figure_when_a_slider_moves():
    """In a real kernel: the calculator shows one figure, and moving a slider replaces that same display."""
    import nbformat
    from nbclient import NotebookClient

    def run(*sources: str) -> list:
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
        return NotebookClient(nb, kernel_name="deepspeed-course", timeout=120).execute().cells

    def png(outputs: list) -> list[str]:
        return [o["data"]["image/png"] for o in outputs if "image/png" in o.get("data", {})]

    show = "from course_utils import planning\nwidget, update = planning.calculator()\ndisplay(widget)\nupdate()"
    moved = run(show, "widget.children[1].value = 4   # ranks: 64 → 4")
    first = run(show)
    assert len(png(moved[0].outputs)) == len(png(first[0].outputs)) == 1, "one figure, updated in place"
    assert moved[1].outputs == [], "the redraw goes to the calculator's figure, not to the cell that moved the slider"
    assert png(moved[0].outputs) != png(first[0].outputs), "moving the slider must redraw the figure"


def test_one_offload_table():
    assert zero_rules.offloaded({"offload_optimizer": {"device": "cpu"}}) == {"optimizer", "grads"}
    assert zero_rules.offloaded({"offload_optimizer": {"device": "nvme"}, "offload_param": {"device": "nvme"}}) == {
        "optimizer", "grads", "params"}
    assert zero_rules.offloaded({"offload_optimizer": {"device": "none"}, "stage": 2}) == set()


def test_offload_optimizer_matches_deepspeeds_estimator():
    """DeepSpeed's stage-2 estimator with cpu_offload keeps only the 16-bit parameters on the GPU: 2Ψ."""
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    psi, gpus = 10**9, 8
    _, gpu = estimate_zero2_model_states_mem_needs(psi, gpus, 1, cpu_offload=True)
    assert zero_rules.predicted_device_bytes(psi, 2, gpus, "bf16", {"offload_optimizer": {"device": "cpu"}}) == gpu


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("ranks", [1, 2, 64])
def test_notebook_04_prediction_and_notebook_05_calculator_agree(dtype, ranks):
    """The same model size, ranks, stage, offload and dtype give the same accelerator bytes in notebook 04's
    ladder prediction and in notebook 05's calculator."""
    from course_utils.common.zero_rules import LADDER
    from course_utils.kernel.views.offload import ladder_prediction

    psi = 13_824_000
    predicted = ladder_prediction(psi, ranks, dtype)
    calculator_option = {frozenset(zero_rules.offloaded(zero)): name for name, zero in planning.OFFLOAD.items()}
    for rung, (stage, zero) in LADDER.items():
        option = calculator_option[frozenset(zero_rules.offloaded(zero))]
        parts = planning.per_rank_bytes(psi / 1e9, ranks, stage, option, dtype)
        calculated = sum(p["device"] for p in parts.values()) * zero_rules.GB
        assert calculated == pytest.approx(predicted[rung], rel=1e-12), (rung, option)


def test_a_plan_config_is_judged_by_deepspeeds_reading_and_the_ladder():
    """Notebook 05's exercise 2: each way a config can miss the plan gets its own message, none naming the answer."""
    from course_utils.kernel import configs

    work = planning.Workload(params=6.7e9, largest_layer=32000 * 4096, act_gb_per_sample=6, ckpt_act_gb_per_sample=1.5)
    machine = planning.Machine(gpu_gb=24, gpus=2, cpu_gb=256)
    right = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4, "bf16": {"enabled": True},
             "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}

    def problem(**change):
        cfg = {**right, **change}
        return planning.plan_problem(configs.parse({k: v for k, v in cfg.items() if v is not None}, world_size=2),
                                     work, machine, 64)

    assert problem() is None
    assert planning.config_rung(configs.parse(right, world_size=2)) == (2, True, False, False)
    assert "fp32" in problem(bf16=None)
    assert problem(bf16=None, fp16={"enabled": True}) is None
    assert "global batch of 32" in problem(train_batch_size=32)
    assert "does not fit" in problem(zero_optimization={"stage": 3})                          # too little memory
    assert "more than it needs" in problem(zero_optimization={"stage": 3, "offload_optimizer": {"device": "cpu"}})
    assert "no NVMe" in problem(zero_optimization={"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/x"},
                                                   "offload_param": {"device": "nvme", "nvme_path": "/x"}})
    assert "more than 24 GB" in problem(train_micro_batch_size_per_gpu=8)
    assert "a larger one fits too" in problem(train_micro_batch_size_per_gpu=2)
    with pytest.raises(configs.ConfigError, match="train_batch_size is not equal"):    # DeepSpeed's own assertion
        configs.parse({**right, "train_micro_batch_size_per_gpu": 7}, world_size=2)
    for message in filter(None, [problem(train_micro_batch_size_per_gpu=2), problem(train_batch_size=32)]):
        assert "micro-batch of 4" not in message and "stage 2" not in message


def test_edge_grad_numel_follows_deepspeeds_partitioning():
    # 10 + 7 + 5 = 22 elements, padded to 24 (a multiple of 2 × 2 ranks): partitions [0, 12) and [12, 24);
    # the 7-element parameter starts at 10 and straddles the edge, so both ranks hold it whole
    assert zero_rules.edge_grad_numel([10, 7, 5], 2, 0) == 10 + 7
    assert zero_rules.edge_grad_numel([10, 7, 5], 2, 1) == 7 + 5
    # the same rule as DeepSpeed's own get_partition_info (it reads no engine state), on sizes with an edge in
    # the middle of parameters, for several world sizes
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    numels = [1000, 37, 4096, 3, 250, 999, 64]
    for world in (1, 2, 3, 4, 8):
        flat = -(-sum(numels) // (2 * world)) * 2 * world
        for rank in range(world):
            inside, _, _ = DeepSpeedZeroOptimizer.get_partition_info(None, [torch.empty(n) for n in numels],
                                                                     flat // world, rank)
            assert zero_rules.edge_grad_numel(numels, world, rank) == sum(t.numel() for t in inside), (world, rank)
