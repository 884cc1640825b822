"""The scripts the launcher runs, imported as modules: importing runs nothing, every script has a
``main(argv=None)``, and their steps are tested here without launching any rank."""
import inspect
import json
import statistics
from types import SimpleNamespace

import pytest
import torch

from course_utils.kernel import checks
from script_modules import load_script
from course_utils.common import paths
from course_utils.rank.memory import TensorEntry
from course_utils.common.record import plain, read_as
from course_utils.common.records.offload import Rung
from course_utils.rank.scaffolding import load_config, load_exercise, parse_args, read_config

SCRIPTS = sorted(p.stem for p in paths.SCRIPTS.glob("[0-9]*.py"))
REQUIRED = {"01_ring": ["--ring_file", "ring.py"], "09_checkpoints": ["--mode", "train", "--out", "o"],
            "10_translation": ["--output_dir", "o"], "05_out_of_memory": ["--cgroup_procs", "x"],
            "16_this_machine": ["--swap_dir", "x"]}


@pytest.mark.parametrize("name", SCRIPTS)
def test_script_imports_without_running_and_parses_what_the_runner_passes(name):
    module = load_script(name)
    assert inspect.signature(module.main).parameters["argv"].default is None
    source = (paths.SCRIPTS / f"{name}.py").read_text()
    assert source.rstrip().endswith('if __name__ == "__main__":\n    main()'), "work only in main()"
    args = parse_args(module.build_parser(), REQUIRED.get(name, []) + ["--local_rank", "1",
                                                                     "--deepspeed_config", "configs/zero0.json"])
    assert args.local_rank == 1 and args.deepspeed_config == "configs/zero0.json"
    assert load_script(name) is module, "loaded once per process"


def test_load_names_a_missing_script():
    with pytest.raises(FileNotFoundError, match="04_offload_ladder"):
        load_script("04_offload_ladders")


def _entry(category: str, nbytes: int, device: str = "cpu") -> TensorEntry:
    return TensorEntry(path=f"x.{category}", category=category, dtype="float32", numel=nbytes // 4, nbytes=nbytes,
                       device=device)


INVENTORY = [_entry("params", 400), _entry("grads", 200), _entry("optimizer", 1600), _entry("buffers", 64)]


def _held(inventory: list[TensorEntry], optimizer: str = "DeepSpeedZeroOptimizer", inner: str | None = "DeepSpeedCPUAdam"):
    from course_utils.rank.placement import holdings
    return holdings(inventory, optimizer, inner)


def test_04_holdings_name_deepspeeds_structures():
    from course_utils.rank import placement as s
    inventory = [TensorEntry("optimizer.optimizer.state[<param>]['exp_avg']", "optimizer", "float32", 10, 40, "cpu"),
                 TensorEntry("optimizer.optimizer.state[<param>]['exp_avg']", "optimizer", "float32", 10, 40, "cpu"),
                 TensorEntry("optimizer.single_partition_of_fp32_groups[0]", "optimizer", "float32", 10, 40, "cuda:0"),
                 TensorEntry("module.h.0.attn.c_attn.weight.ds_tensor", "params", "bfloat16", 5, 10, "cuda:0"),
                 TensorEntry("module.h.0.ln_1.weight", "buffers", "float32", 2, 8, "cuda:0")]
    held = _held(inventory)
    assert [(h.state, h.structure, h.device, h.bytes, h.tensors) for h in held] == [
        ("params", "module parameter.ds_tensor", "cuda", 10, 1),
        ("optimizer", "DeepSpeedCPUAdam.state[p]['exp_avg']", "cpu", 80, 2),
        ("optimizer", "DeepSpeedZeroOptimizer.single_partition_of_fp32_groups[i]", "cuda", 40, 1),
        ("buffers", "module buffer", "cuda", 8, 1)]
    assert s.structure_name("optimizer.state[<param>]['exp_avg_sq']", "FusedAdam", None) == "FusedAdam.state[p]['exp_avg_sq']"


def test_04_rung_record_from_fake_measurements(tmp_path):
    from course_utils.rank import placement as s
    (tmp_path / "zero_stage_3" / "optimizer").mkdir(parents=True)
    (tmp_path / "zero_stage_3" / "optimizer" / "a.swp").write_bytes(b"")
    common = dict(rank=0, dtype="fp32", step_times=[0.3, 0.1, 0.2], held=_held(INVENTORY), accelerator="cpu",
                  accelerator_peak=0, gathered_in_forward=0, persistent_numel=0,
                  optimizer="DeepSpeedCPUAdam", loss=1.5)
    rung = s.make_rung("stage 2 + offload", swap_dir=str(tmp_path), **common)
    assert rung.step_seconds == statistics.median([0.3, 0.1, 0.2])
    assert rung.model_state_bytes == 400 + 200 + 1600, "buffers are not model states"
    assert (rung.device_bytes, rung.host_bytes) == (2200, 0), "a CPU-only machine: the accelerator is the CPU"
    assert rung.swap_files == ["zero_stage_3/optimizer/a.swp"]
    assert s.make_rung("stage 2", **common).swap_files is None
    line = json.loads(json.dumps({"name": "rung", "rank": 0, "value": plain(rung)}))   # as the runner reads it back
    assert read_as([line], Rung) == [rung]


def test_04_gpu_placement_follows_the_tensors_devices():
    from course_utils.rank import placement as s
    inventory = [_entry("params", 400, "cuda:0"), _entry("grads", 200, "cpu"), _entry("optimizer", 1600, "cpu"),
                 _entry("buffers", 64, "cuda:0")]
    rung = s.make_rung("stage 2 + offload", rank=0, dtype="bf16", step_times=[1.0], held=_held(inventory),
                       accelerator="cuda", accelerator_peak=0, gathered_in_forward=0,
                       persistent_numel=0, optimizer="x", loss=0.0)
    assert (rung.device_bytes, rung.host_bytes) == (400, 1800)


def test_05_bucket_record_counts_buffers_only():
    bucket = load_script("05_bucket_memory").bucket_record(1e6, "bf16", 1, INVENTORY)
    assert bucket.buffer_bytes == 64 and bucket.buffers == [{"path": "x.buffers", "numel": 16, "nbytes": 64}]
    assert bucket.model_states["model_states"] == 2200


def test_01_ring_record_compares_with_all_reduce():
    s = load_script("01_ring")
    reference = torch.arange(8, dtype=torch.float32)
    ring = s.ring_result(0, 4, reference.clone(), reference, {"bytes": 48, "messages": 6})
    assert ring.matches and ring.max_abs_diff == 0.0
    assert ring.tensor_bytes == 32 and ring.expected_bytes == 2 * 3 / 4 * 32
    assert not s.ring_result(0, 4, reference + 1, reference, {"bytes": 0, "messages": 0}).matches


def test_02_learner_functions_replace_only_what_the_exercise_file_defines(tmp_path):
    s = load_script("02_train")
    assert s.learner_functions([]) == {"shard_loader": s.shard_loader, "gather_predictions": s.gather_predictions,
                                       "train_step": s.train_step}

    def shard_loader(dataset, batch_size, rank, world_size, shuffle=False, seed=0):
        return ["mine", dataset, batch_size, rank, world_size]

    path = checks.export_function(shard_loader, tmp_path / "shard_loader.py")   # as the notebook writes it
    found = s.learner_functions([path])
    assert found["shard_loader"]([1], 2, 0, 1) == ["mine", [1], 2, 0, 1]
    assert found["gather_predictions"] is s.gather_predictions
    assert load_exercise(path, ["gather_predictions"]) == {}


def test_02_the_course_shard_loader_pads_and_covers():
    s = load_script("02_train")
    shards = [[i for b in s.shard_loader(list(range(7)), 2, r, 3) for i in b.tolist()] for r in range(3)]
    assert [len(x) for x in shards] == [3, 3, 3]
    assert set(sum(shards, [])) == set(range(7))


def test_03_persistent_parameters_only_count_in_stage_3():
    s = load_script("03_zero_memory")
    module = SimpleNamespace(parameters=lambda: [SimpleNamespace(ds_numel=n) for n in (10, 1000, 50)])
    assert s.persistent_numel(module, 3, 100) == 60
    assert s.persistent_numel(module, 2, 100) == 0


def test_06_precision_configs_change_only_the_precision():
    s = load_script("06_mixed_precision")
    base = read_config(paths.CONFIGS / "06_loss_scaling.json")
    configs = {name: s.precision_config(base, name) for name in s.PRECISIONS}
    assert "fp16" not in configs["fp32"] and "bf16" not in configs["fp32"] and "scheduler" not in configs["fp32"]
    assert configs["bf16"]["bf16"] == {"enabled": True} and "communication_data_type" not in configs["bf16"]
    assert configs["bf16+fp32 comm"]["communication_data_type"] == "fp32"
    assert configs["fp16"]["fp16"] == base["fp16"] and "scheduler" in base
    runs = dict(s.loss_scaling_runs(base["fp16"], [1024.0]))
    assert runs["dynamic"] is base["fp16"] and runs["static 1024"]["loss_scale"] == 1024.0
    assert type(s.scaler_for(runs["dynamic"])).__name__ == "DynamicLossScaler"
    assert s.scaler_for(runs["static 1024"]).loss_scale == 1024.0


def test_07_optimizer_and_scheduler_configs_leave_the_base_alone():
    s = load_script("07_optimizers_and_schedulers")
    base = read_config(paths.CONFIGS / "07_base.json")
    before = json.dumps(base, sort_keys=True)
    offload = s.optimizer_config(base, "Adam + offload")
    assert offload["zero_optimization"]["offload_optimizer"] == {"device": "cpu"}
    assert s.scheduler_config(base, {"type": "WarmupLR"})["optimizer"]["type"] == "AdamW"
    assert json.dumps(base, sort_keys=True) == before


def test_08_every_trainer_run_shares_the_settings():
    s = load_script("08_trainer_integration")
    args = parse_args(s.build_parser(), ["--steps", "7", "--learning_rate", "0.5"])
    settings = s.trainer_settings(args)
    assert settings["max_steps"] == 7 and settings["learning_rate"] == 0.5 and settings["gradient_accumulation_steps"] == 2


def test_09_engine_config_sets_the_stage_and_universal_loading():
    s = load_script("09_checkpoints")
    args = parse_args(s.build_parser(), ["--mode", "layout", "--out", "o", "--deepspeed_config",
                                         str(paths.CONFIGS / "09_checkpoints.json")])
    base = load_config(args)
    config = s.engine_config(base, 3, universal=True, stage3_gather_16bit_weights_on_model_save=True)
    assert config["zero_optimization"]["stage"] == 3 and config["checkpoint"] == {"load_universal": True}
    assert config["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True
    assert "checkpoint" not in base and "stage3_gather_16bit_weights_on_model_save" not in base["zero_optimization"]
    assert "checkpoint" not in s.engine_config(base, 1)


def test_10_evaluation_gives_every_rank_one_equal_batch():
    from datasets import Dataset

    s = load_script("10_translation")
    split = Dataset.from_dict({"translation": [{"src": str(i), "tgt": str(i)} for i in range(7)]})
    examples, batch = s.evaluation_split(split, 2)
    assert (len(examples), batch) == (6, 3), "the remainder of an uneven split is left out"
    assert s.evaluation_split(split, 1)[1] == 7
    with pytest.raises(ValueError, match="at least 8"):
        s.evaluation_split(split, 8)
    assert len(s.first(split, 3)) == 3 and len(s.first(split, None)) == 7 and len(s.first(split, 99)) == 7
    from course_utils.common.records.translation import Generation

    record = {"name": "generation", "rank": 0, "value": plain(Generation(batch_size=batch, max_length=64, examples=6))}
    assert read_as([record], Generation)[0].examples == 6


def test_scripts_load_their_config_through_one_helper():
    with pytest.raises(SystemExit, match="--deepspeed_config"):
        load_config(SimpleNamespace(deepspeed_config=None))
    for path in paths.SCRIPTS.glob("*.py"):
        assert "json.load(open(" not in path.read_text() and "spec_from_file_location" not in path.read_text(), path.name


def test_11_every_accumulation_split_trains_on_the_same_samples_with_plain_sgd():
    from course_utils.rank import perf

    s = load_script("11_performance")
    world = 2
    for step in range(2):
        for key in ("input_ids", "labels"):
            splits = {(micro, gas): torch.cat([torch.cat([b[key] for b in perf.micro_batches(step, r, world, micro, gas)])
                                               for r in range(world)]) for micro, gas in s.ACCUMULATION}
            first, *others = splits.values()
            assert all(torch.equal(first, other) for other in others)
        assert all(len(b["input_ids"]) == micro for (micro, gas) in s.ACCUMULATION
                   for b in perf.micro_batches(step, 0, world, micro, gas))
        # the samples end at different lengths: micro-batches label different numbers of tokens (exercise 1's point)
        labelled = [int((b["labels"] != -100).sum()) for b in perf.micro_batches(step, 0, world, 2, 4)]
        assert len(set(labelled)) > 1, labelled
        first_token = torch.cat([b["labels"][:, 0] for b in perf.micro_batches(step, 0, world, 8, 1)])
        assert bool((first_token == -100).all()), "nothing predicts a sequence's first token"
    base = read_config(paths.CONFIGS / "11_performance.json")
    cfg = s.accumulation_config(base, 2, 4)
    assert (cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"]) == (2, 4)
    assert cfg["optimizer"]["type"] == "SGD" and cfg["zero_allow_untested_optimizer"] is True
    assert cfg["gradient_clipping"] == 0.0, "an update must scale with the loss: DeepSpeed clips at 1.0 by default"
    assert not {"flops_profiler", "csv_monitor", "wall_clock_breakdown"} & set(cfg)
    assert "flops_profiler" in base, "the base config keeps its profiling sections"
