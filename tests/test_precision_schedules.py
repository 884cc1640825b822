"""Fast unit tests of the precision helpers, the HF/DS combination configs and the "auto" tables."""
import torch

from course_utils import configs
from course_utils.rank import trainer
from course_utils.rank.data import random_batch
from course_utils.rank.engine import dtype_name
from course_utils.views import precision
from course_utils.views import trainer as trainer_views


def test_overflow_table_shows_the_fp16_pitfall():
    rows = {r["dtype"]: r for r in precision.overflow_table()}
    assert rows["float32"]["finite"] and rows["bfloat16"]["finite"]
    assert not rows["float16"]["finite"]
    assert rows["float32"]["max |logit|"] > precision.FP16_MAX > rows["float16"]["max |activation|"]


def test_skipped_steps_and_dtype_names():
    assert precision.skipped_steps([True, False, True]) == [0, 2]
    assert dtype_name(torch.bfloat16) == "bfloat16" and dtype_name(None) is None


def test_random_batch_differs_per_rank_and_repeats():
    a, b = random_batch(0, 0), random_batch(0, 1)
    assert not torch.equal(a[0], b[0])
    assert torch.equal(a[0], random_batch(0, 0)[0])


def test_combo_config_removes_the_sections_hf_provides():
    base = {"optimizer": {"type": "AdamW"}, "scheduler": {"type": "WarmupLR"}, "zero_optimization": {"stage": 2}}
    cfg = trainer.combo_config(base, hf_opt=True, hf_sched=False, offload=True)
    assert "optimizer" not in cfg and "scheduler" in cfg
    assert cfg["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert "offload_optimizer" not in trainer.combo_config(cfg, False, False, False)["zero_optimization"]
    assert base == {"optimizer": {"type": "AdamW"}, "scheduler": {"type": "WarmupLR"}, "zero_optimization": {"stage": 2}}
    assert len(trainer.combos()) == 8
    assert trainer.combo_key(False, True, True) == "ds_opt+hf_sched+offload"


def test_auto_keys_and_resolution_table():
    written = {"optimizer": {"params": {"lr": "auto", "eps": 1e-8}}, "train_batch_size": "auto"}
    received = {"optimizer": {"params": {"lr": 0.001, "eps": 1e-8}}, "train_batch_size": 16}
    assert configs.auto_keys(written) == ["optimizer.params.lr", "train_batch_size"]
    rows = trainer_views.resolution_table(written, received, [trainer.AutoFill("optimizer.params.lr", 0.001,
                                                                               "learning_rate")])
    assert rows[0] == {"key": "optimizer.params.lr", "written": "auto", "received by DeepSpeed": 0.001,
                       "filled from": "learning_rate"}
    assert rows[1]["filled from"] == "(not filled)"


def test_other_changes_ignores_auto_and_reports_the_rest():
    written = {"steps_per_print": 10, "optimizer": {"params": {"lr": "auto"}}, "stage": 2}
    received = {"steps_per_print": float("inf"), "optimizer": {"params": {"lr": 0.1}}, "stage": 2}
    assert trainer_views.other_changes(written, received) == {"steps_per_print": (10, float("inf"))}
