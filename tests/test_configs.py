"""Config checks: DeepSpeed's own classes plus the mistakes DeepSpeed lets through silently."""
import json

import pytest

from course_utils import paths
from course_utils.configs import ConfigError, validate


def base(**extra):
    return {"train_micro_batch_size_per_gpu": 2, **extra}


@pytest.mark.parametrize("path", sorted(paths.CONFIGS.glob("*.json")), ids=lambda p: p.name)
def test_every_shipped_config_is_valid(path):
    validate(path, world_size=2, trainer=path.name.startswith("trainer") or "auto" in path.read_text())


@pytest.mark.parametrize("config, world_size, fragment", [
    (base(zero_optimisation={"stage": 2}), 2, "did you mean 'zero_optimization'"),
    (base(zero_optimization={"stage": 2, "stage3_max_live_parameters": 1e9}), 2, "only acts in ZeRO stage 3"),
    (base(zero_optimization={"stage": 1, "offload_param": {"device": "cpu"}}), 2, "only acts in ZeRO stage 3"),
    (base(zero_optimization={"stage": 0, "offload_optimizer": {"device": "cpu"}}), 2, "needs ZeRO"),
    (base(zero_optimization={"stage": 3, "stage3_max_live_params": 1e9}), 2, "stage3_max_live_parameters"),
    (base(fp16={"enabled": True, "loss_scal": 0}), 2, "fp16.loss_scal"),
    (base(zero_optimization={"stage": 3, "offload_param": {"device": "gpu"}}), 2,
     "offload_param.device: \"gpu\" is not allowed; use one of 'none', 'cpu', 'nvme'"),
    (base(zero_optimization={"stage": 4}), 2, "zero_optimization.stage: 4 is not allowed; use one of 0, 1, 2, 3"),
    (base(zero_optimization={"stage": 2, "reduce_bucket_size": "big"}), 2, "reduce_bucket_size: \"big\" is not allowed"),
    ({"train_batch_size": 6, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2}, 2,
     "train_batch_size = train_micro_batch_size_per_gpu"),
    (base(optimizer={"type": "AdamWW"}), 2, "Did you mean 'AdamW'"),
    (base(scheduler={"type": "WarmUpLR"}), 2, "Did you mean 'WarmupLR'"),
    (base(fp16={"enabled": True}, bf16={"enabled": True}), 2, "cannot be simultaneously enabled"),
    (base(optimizer={"type": "AdamW", "params": {"lr": "auto"}}), 2, "filled in only by the Hugging Face Trainer"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_mistakes_raise_config_error_naming_the_key(config, world_size, fragment):
    with pytest.raises(ConfigError) as err:
        validate(config, world_size=world_size)
    assert fragment in str(err.value)


def test_a_wrong_value_of_a_known_key_gets_no_spelling_suggestion():
    with pytest.raises(ConfigError) as err:
        validate(base(zero_optimization={"stage": 4}))
    assert "did you mean" not in str(err.value) and "or 3" not in str(err.value)


def test_batch_sizes_are_checked_with_the_launch_world_size():
    cfg = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2}
    validate(cfg, world_size=2)
    with pytest.raises(ConfigError):
        validate(cfg, world_size=4)


def test_auto_values_pass_for_the_trainer_only():
    cfg = json.loads((paths.CONFIGS / "trainer_zero2_offload.json").read_text())
    assert validate(cfg, world_size=2, trainer=True) == cfg       # returned as written, autos kept
    with pytest.raises(ConfigError, match="auto"):
        validate(cfg, world_size=2)


def test_file_errors_say_where(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text('{\n  "train_micro_batch_size_per_gpu": 2,\n}\n')
    with pytest.raises(ConfigError, match="line 3"):
        validate(broken)
    with pytest.raises(ConfigError, match="does not exist"):
        validate(tmp_path / "missing.json")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="JSON object"):
        validate(tmp_path / "list.json")
