"""Notebook 17's Trainer route without a launch: exercise 4's check of ``trainer_parallelism`` (accelerate's and
DeepSpeed's own code run in the kernel for world sizes this machine does not have), and the script's
ParallelismConfig."""
import argparse

import pytest

from course_utils.kernel.views import long_context_trainer as views
from script_modules import load_script


def largest(heads, kv_heads, world_size):
    return max(d for d in range(1, world_size + 1) if world_size % d == 0 and heads % d == 0
               and (kv_heads % d == 0 or d % kv_heads == 0))


def replicated(heads, kv_heads, world_size):
    sp = largest(heads, kv_heads, world_size)
    return {"sp_backend": "deepspeed", "sp_size": sp, "dp_replicate_size": world_size // sp}


def sharded(heads, kv_heads, world_size):
    sp = largest(heads, kv_heads, world_size)
    return {"sp_backend": "deepspeed", "sp_size": sp, "dp_shard_size": world_size // sp}


def copier(heads, kv_heads, world_size):
    """The page's ParallelismConfig(sp_backend="deepspeed", sp_size=2) carried to other worlds: every rank in SP."""
    return {"sp_backend": "deepspeed", "sp_size": world_size}


def query_heads_only(heads, kv_heads, world_size):
    """The rule transformers' ALST guide states ("the number of attention heads must be divisible by sp_size")."""
    sp = max(d for d in range(1, world_size + 1) if world_size % d == 0 and heads % d == 0)
    return {"sp_backend": "deepspeed", "sp_size": sp, "dp_replicate_size": world_size // sp}


def no_data_parallel(heads, kv_heads, world_size):
    return {"sp_backend": "deepspeed", "sp_size": largest(heads, kv_heads, world_size)}


@pytest.mark.parametrize("answer", [replicated, sharded])
def test_the_largest_accepted_sp_with_the_rest_data_parallel_passes(answer):
    assert views.judge_parallelism(answer) == []


@pytest.mark.parametrize("answer, rule, refused", [(copier, "UlyssesSPAttentionHF", 6),
                                                    (query_heads_only, "KV attention head count", 2),
                                                    (no_data_parallel, "batch check", 4)])
def test_wrong_answers_are_refused_by_the_rule_they_break_without_the_expected_size(answer, rule, refused):
    problems = views.judge_parallelism(answer)
    assert len(problems) == refused and all(rule in p for p in problems), problems
    expected = {label: largest(h, kv, w) for label, h, kv, w in views.CASES}
    for problem in problems:
        label = next(lbl for lbl in expected if problem.startswith(f"for {lbl}:"))
        assert f"sp_size={expected[label]}" not in problem and f"SP size {expected[label]}" not in problem, problem


def test_a_smaller_sp_than_accepted_is_refused():
    def half(heads, kv_heads, world_size):
        sp = max(1, largest(heads, kv_heads, world_size) // 2)
        return {"sp_backend": "deepspeed", "sp_size": sp, "dp_replicate_size": world_size // sp}

    problems = views.judge_parallelism(half)
    assert problems and all("larger SP size" in p for p in problems), problems


def test_the_check_leaves_deepspeeds_modules_as_they_were():
    import deepspeed.comm
    import deepspeed.runtime.sequence_parallel.parallel_state_sp as groups
    import deepspeed.runtime.sequence_parallel.ulysses_sp as ulysses
    from deepspeed.sequence.layer import register_all_to_all_group

    views.judge_parallelism(copier)
    assert groups._SEQUENCE_PARALLEL_GROUP is None and groups._SEQUENCE_DATA_PARALLEL_GROUP is None
    assert groups.dist is deepspeed.comm and ulysses.dist is deepspeed.comm
    assert ulysses.register_all_to_all_group is register_all_to_all_group


def test_an_unwritten_exercise_is_not_judged():
    def stub(heads, kv_heads, world_size):
        raise NotImplementedError()

    with pytest.raises(NotImplementedError):
        views.judge_parallelism(stub)


def test_the_script_gives_accelerate_the_models_attention_for_sp():
    script = load_script("17_trainer_sp")
    args = argparse.Namespace(seq_len=512, sp_size=2, parallelism=None)
    pc = script.parallelism(args)
    assert pc.sp_size == 2 and pc.sp_handler.sp_attn_implementation == "sdpa"
    assert pc.sp_handler.sp_seq_length == 512 and not pc.sp_handler.sp_seq_length_is_variable
    plain = script.parallelism(argparse.Namespace(seq_len=512, sp_size=2, parallelism='{"sp_size": 1}'))
    assert plain.sp_size == 1 and plain.sp_handler is None
