"""Config checks: DeepSpeed's own classes plus the mistakes DeepSpeed lets through silently."""
import json

import pytest

from course_utils.common import paths
from course_utils.kernel.config_doctor import world_of
from course_utils.kernel import configs
from course_utils.kernel.configs import ConfigError, diagnose, validate


def base(**extra):
    return {"train_micro_batch_size_per_gpu": 2, **extra}


def deepspeed_reads(config: dict, world_size: int = 2) -> bool:
    """Whether DeepSpeed's own DeepSpeedConfig reads the config without raising."""
    from deepspeed.runtime.config import DeepSpeedConfig
    try:
        with world_of(world_size):
            DeepSpeedConfig(json.loads(json.dumps(config)))
    except Exception:       # noqa: BLE001 - any refusal counts, whatever DeepSpeed raised
        return False
    return True


@pytest.mark.parametrize("path", sorted(paths.CONFIGS.glob("*.json")), ids=lambda p: p.name)
def test_every_shipped_config_is_valid(path):
    validate(path, world_size=2, trainer=path.name.startswith("trainer") or "auto" in path.read_text())


@pytest.mark.parametrize("config, world_size, fragment", [
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
    # DeepSpeed's other refusals: a removed block (DeepSpeedConfigError), and whatever its code raises on a value
    (base(nebula={"enabled": True}), 2, "nebula: DeepSpeed"),
    (base(zero_optimization={"stage": 3, "mics_shard_size": 2}), 2, "zero_optimization.mics_shard_size: DeepSpeed"),
    (base(checkpoint={"tag_validation": "maybe"}), 2, "checkpoint.tag_validation: DeepSpeed refuses it"),
    (base(data_types={"keep_in_fp32_modules": 3}), 2, "data_types.keep_in_fp32_modules: DeepSpeed refuses it"),
    (base(communication_data_type="fp8"), 2, "communication_data_type: DeepSpeed refuses it (ValueError"),
    (base(optimizer="Adam"), 2, "optimizer: DeepSpeed refuses it (AttributeError"),
    (base(fp16=[True]), 2, "fp16: DeepSpeed refuses it (TypeError"),
    (base(fp16={"enabled": True, "fp16_master_weights_and_grads": True}), 2,
     "fp16.fp16_master_weights_and_grads: DeepSpeed refuses it (AssertionError"),
    (base(zero_optimization={"stage": 2, "cpu_offload": True, "offload_optimizer": {"device": "cpu"}}), 2,
     "zero_optimization.cpu_offload, zero_optimization.offload_optimizer: DeepSpeed refuses them"),
    # a section's own validator (no field location): its message, on the section
    (base(zero_optimization={"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}), 2,
     "zero_optimization: Partial offloading only supported for ZeRO Stage 3"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_mistakes_raise_config_error_naming_the_key(config, world_size, fragment):
    with pytest.raises(ConfigError) as err:
        validate(config, world_size=world_size)
    assert type(err.value) is ConfigError and fragment in str(err.value)
    assert err.value.__cause__ is None and "Traceback" not in str(err.value)


def test_every_problem_comes_in_one_error():
    config = base(zero_optimisation={"stage": 2}, amp={"enabled": True}, sparse_attention={"mode": "fixed"},
                  fp16={"enabled": True, "loss_scal": 0}, bf16={"enabled": "yes please"},
                  optimizer={"type": "AdamWW"}, gradient_accumulation_steps=0)
    with pytest.raises(ConfigError) as err:
        validate(config, world_size=2)
    message = str(err.value)
    named = [line[4:].split(": ")[0] for line in message.splitlines() if line.startswith("  - ")]
    for key in ("amp", "sparse_attention", "fp16.loss_scal", "bf16.enabled", "optimizer.type",
                "gradient_accumulation_steps"):
        assert any(key in keys.split(", ") for keys in named), f"{key} missing from:\n{message}"
    assert len(named) == 6 and "6 problems" in message          # the misspelt block is a warning (below)
    assert [w for w in diagnose(config, world_size=2).warnings if "'zero_optimisation'" in w]


@pytest.mark.parametrize("key, value, near", [("zero_optimisation", {"stage": 2}, "zero_optimization"),
                                              ("comms_config", {"verbose": False}, "comms_logger"),
                                              ("gradient_clip", 1.0, "gradient_clipping")])
def test_a_misspelt_top_level_block_is_a_loud_warning_never_an_error(key, value, near, capsys):
    """DeepSpeed runs a config whose top-level key it has no option for (it never reads it), so the pre-check lets
    it through too, but first in its warning line, naming the key it is close to."""
    config = base(cuda_visible_devices=0, **{key: value})     # the unrelated key first: the typo still leads
    assert deepspeed_reads(config)
    capsys.readouterr()
    assert validate(config, world_size=2) == config
    printed = capsys.readouterr().out
    assert printed.count("\n") == 1
    assert f"Config warning (<dict>): LIKELY TYPO: DeepSpeed ignores the top-level key {key!r}" in printed
    assert f"did you mean {near!r}? Rename it" in printed and "'cuda_visible_devices'" in printed


@pytest.mark.parametrize("note", ["_comment", "comment", "comments", "_description", "description", "note", "_notes",
                                  "__doc__"])
def test_a_note_at_the_top_level_passes_without_a_word(note, capsys):
    """A note to the config's readers is no typo, however close its name is to an option ("comment" and
    ``comet``): DeepSpeed ignores it, and the pre-check says nothing."""
    config = base(**{note: "ZeRO-2 for 2 ranks", "zero_optimization": {"stage": 2}})
    assert deepspeed_reads(config)
    capsys.readouterr()
    verdict = diagnose(config, world_size=2)
    assert verdict.errors == [] and verdict.warnings == []
    assert validate(config, world_size=2) == config
    assert "Config warning" not in capsys.readouterr().out


@pytest.mark.parametrize("config, path", [
    (base(zero_optimization={"stage": 2, "_comment": "why"}), "zero_optimization._comment"),
    (base(fp16={"enabled": True, "comment": "why"}), "fp16.comment"),
    (base(zero_optimization={"stage": 3, "offload_param": {"device": "cpu", "_note": "why"}}),
     "zero_optimization.offload_param._note"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_a_note_inside_a_strict_section_is_refused_as_deepspeed_refuses_it(config, path):
    """DeepSpeed's section models forbid unknown keys, notes included; the pre-check agrees and says where a note
    can go instead, with no spelling suggestion."""
    assert not deepspeed_reads(config)
    with pytest.raises(ConfigError) as err:
        validate(config, world_size=2)
    message = str(err.value)
    assert f"{path}: DeepSpeed refuses any key this section has no option for, notes included" in message
    assert "move the note to the top level" in message and "did you mean" not in message


def test_a_note_inside_a_section_deepspeed_reads_by_key_passes():
    """The optimizer and scheduler sections are plain dicts DeepSpeed reads by key: it ignores a note there."""
    config = base(optimizer={"type": "AdamW", "_comment": "betas from the paper", "params": {"lr": 1e-3}},
                  scheduler={"type": "WarmupLR", "_comment": "short warm-up", "params": {"warmup_num_steps": 10}})
    assert deepspeed_reads(config)
    verdict = diagnose(config, world_size=2)
    assert verdict.errors == [] and verdict.warnings == []


@pytest.mark.parametrize("name, instead, reason", [
    ("OneBitAdam", "Adam", "1bit-Adam"), ("onebitadam", "Adam", "1bit-Adam"), ("ZeroOneAdam", "Adam", "0/1 Adam"),
    ("OneBitLamb", "Lamb", "1bit-Lamb")])
@pytest.mark.parametrize("stage", [0, 1, 3])
def test_one_bit_optimizers_are_refused_with_deepspeeds_reasons(name, instead, reason, stage):
    """0.19.8 has no 1-bit optimizer (the engine's _is_supported_optimizer refuses the name); the pre-check says so,
    what to write instead and which settings to drop, and under ZeRO the reason the versions that had them refused
    them."""
    from deepspeed.runtime.engine import DeepSpeedEngine
    config = base(optimizer={"type": name, "params": {"lr": 1e-3, "weight_decay": 0.01, "freeze_step": 400}},
                  zero_optimization={"stage": stage})
    assert deepspeed_reads(config) and not DeepSpeedEngine._is_supported_optimizer(None, name)
    with pytest.raises(ConfigError) as err:
        validate(config, world_size=2)
    message = str(err.value)
    assert f"optimizer.type: {name!r} is one of DeepSpeed's 1-bit optimizers" in message
    assert "no longer ships" in message and "is neither a DeepSpeed optimizer" not in message
    assert f"Write {instead!r} instead and remove optimizer.params.freeze_step, which" in message
    assert (f'with ZeRO stage {stage} ("{reason} is not compatible with ZeRO")' in message) == (stage > 0), message


def test_ignored_keys_are_one_warning_line_and_the_launch_goes_on(capsys):
    config = base(cuda_visible_devices=0, my_notes="tried 3 lrs",
                  zero_optimization={"stage": 2, "stage3_max_live_parameters": 1e9, "offload_param": {"device": "cpu"}})
    assert validate(config, world_size=2) == config
    printed = capsys.readouterr().out
    assert printed.count("\n") == 1
    for fragment in ("'cuda_visible_devices'", "'my_notes'", "DeepSpeed ignores",
                     "stage3_max_live_parameters, offload_param only acts in ZeRO stage 3"):
        assert fragment in printed
    verdict = diagnose(base(zero_optimization={"stage": 0, "overlap_comm": True}), world_size=2)
    assert verdict.errors == [] and [w for w in verdict.warnings if "needs ZeRO" in w]


@pytest.mark.parametrize("value", [None, "x", [1], 3, {"bogus": 1}, {"enabled": "x", "type": 3}],
                         ids=lambda v: json.dumps(v))
def test_no_value_of_any_key_crashes_the_check(value):
    """Whatever a top-level key holds, the pre-check answers with a verdict (no exception) whose errors name it."""
    from course_utils.kernel.config_doctor import read
    keys = sorted(k for k in read(base(), 2).read if isinstance(k, str))
    assert len(keys) > 30
    for key in keys:
        verdict = diagnose({**base(), key: value}, world_size=2)
        named = [e.split(": ")[0] for e in verdict.errors]
        assert all(key in said for said in named), f"{key}={value!r}: {verdict.errors}"


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
    broken.write_text('{\n  "train_micro_batch_size_per_gpu": 2,\n  "fp16": {"enabled": true]\n}\n')
    with pytest.raises(ConfigError, match="line 3"):
        validate(broken)
    with pytest.raises(ConfigError, match="does not exist"):
        validate(tmp_path / "missing.json")
    (tmp_path / "twice.json").write_text('{"fp16": {"enabled": true}, "steps_per_print": 1, "fp16": {}}')
    with pytest.raises(ConfigError, match="'fp16' appears twice"):
        validate(tmp_path / "twice.json")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="JSON object"):
        validate(tmp_path / "list.json")


def test_deepspeed_verdict_is_deepspeeds_own_word_for_that_many_ranks():
    config = {**configs.load("02_emotion.json")[0], "train_batch_size": 256, "gradient_accumulation_steps": 4}
    parsed, said = configs.deepspeed_verdict(config, 2)
    assert said == "" and parsed.train_micro_batch_size_per_gpu == 32
    parsed, said = configs.deepspeed_verdict(config, 8)
    assert parsed is None and said.startswith("AssertionError") and "256 != 32 * 4 * 8" in said
    assert "derives" not in said, "DeepSpeed's words only, no course hint"


# A config file of the kind people write by hand: a comment and trailing commas.
COMMENTED = '{\n  // two sequences per rank\n  "train_micro_batch_size_per_gpu": 2,\n  "zero_optimization": {"stage": 2,},\n}\n'


def test_a_file_only_hjson_reads_is_deepspeeds_to_read_and_the_trainers_to_refuse(tmp_path, capsys):
    """DeepSpeed reads a config path with hjson, the Trainer and accelerate with json: the same file passes one
    launcher and stops the other. Each reader is asked here, so the doctor's verdict cannot drift from theirs."""
    from accelerate.utils.deepspeed import HfDeepSpeedConfig
    from deepspeed.runtime.config import DeepSpeedConfig

    path = tmp_path / "by_hand.json"
    path.write_text(COMMENTED)
    with world_of(2):
        assert DeepSpeedConfig(str(path)).zero_optimization_stage == 2          # DeepSpeed's own reader takes it
    with pytest.raises(json.JSONDecodeError):
        HfDeepSpeedConfig(str(path))                                           # the Trainer's and accelerate's does not
    assert validate(path, world_size=2) == {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2}}
    warning = capsys.readouterr().out
    assert "not valid JSON" in warning and "line 2" in warning and "hjson" in warning and "The launch goes on" in warning
    with pytest.raises(ConfigError, match=r"(?s)line 2.*json.load.*Trainer launch stops"):
        validate(path, world_size=2, trainer=True)
    path.write_text(COMMENTED.replace("//", "!!"))                             # neither reads this
    with pytest.raises(ConfigError, match="not valid JSON"):
        validate(path, world_size=2)


QUOTED = {"train_micro_batch_size_per_gpu": "8", "gradient_accumulation_steps": "auto", "train_batch_size": "auto",
          "gradient_clipping": "1.0", "bf16": {"enabled": "false"}, "zero_optimization": {"stage": "2"},
          "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "0.0"}}}


def trainers_verdict(config: dict, tmp_path) -> str:
    """transformers' own check of a Trainer config against TrainingArguments that agree with its values (1 process):
    "" or its error."""
    from transformers import TrainingArguments
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=8, max_grad_norm=1.0,
                             learning_rate=1e-3, weight_decay=0.0, use_cpu=True, report_to=[])
    hf = HfTrainerDeepSpeedConfig(json.loads(json.dumps(config)))
    try:
        hf.trainer_config_process(args)
        hf.trainer_config_finalize(args, None, 10)
    except ValueError as e:
        return str(e)
    return ""


def test_numbers_in_quotes_stop_the_trainer_and_the_doctor_says_which(tmp_path):
    said = trainers_verdict(QUOTED, tmp_path)
    assert "mismatch TrainingArguments" in said and "- ds train_micro_batch_size_per_gpu=8 vs hf " \
        "per_device_train_batch_size=8" in said, said                 # two sides that print alike
    unquoted = {k: (configs._as_number_or_boolean(v) if configs._as_number_or_boolean(v) is not None else v)
                for k, v in configs.leaf_paths(QUOTED).items()}
    fixed = json.loads(json.dumps(QUOTED))
    fixed.update(train_micro_batch_size_per_gpu=8, gradient_clipping=1.0, bf16={"enabled": False})
    fixed["optimizer"]["params"]["weight_decay"] = 0.0
    assert trainers_verdict(fixed, tmp_path) == "", "the same values as numbers agree with the arguments"
    assert unquoted["zero_optimization.stage"] == 2
    problems = diagnose(QUOTED, world_size=2, trainer=True).errors
    named = sorted(p.split(":")[0] for p in problems)
    # every quoted value the Trainer compares, and none it does not (zero_optimization.stage: DeepSpeed reads "2")
    assert named == ["bf16.enabled", "gradient_clipping", "optimizer.params.weight_decay",
                     "train_micro_batch_size_per_gpu"], problems
    assert all("Write" in p and "without quotes" in p for p in problems)
    assert diagnose(fixed, world_size=2, trainer=True).errors == []


def test_the_trainers_compared_keys_are_read_from_transformers():
    compared = configs.trainer_compared_keys()
    assert compared["train_micro_batch_size_per_gpu"] == "per_device_train_batch_size"
    assert {"optimizer.params.lr", "scheduler.params.total_num_steps", "bf16.enabled"} <= set(compared)
    assert "scheduler.params.warmup_min_lr" not in compared, "filled, never compared (fill_only)"
