"""Notebook 15's pieces without a launch: the capacity formula the views state against DeepSpeed's own ``_capacity``,
one MoE layer's dropped tokens against its counts, the expert-list block, and reading gloo's complaint."""
import math

import pytest
import torch

from course_utils.kernel.views import moe as views
from course_utils.rank import moe


@pytest.mark.parametrize("tokens, experts, k, factor, floor", [(64, 4, 1, 1.0, 4), (64, 6, 2, 1.25, 4), (10, 8, 1, 0.5, 4),
                                                               (64, 4, 2, 0.5, 0), (7, 3, 3, 1.1, 1)])
def test_the_capacity_formula_is_deepspeeds(tokens, experts, k, factor, floor):
    from deepspeed.moe.sharded_moe import _capacity

    gates = torch.zeros(tokens, experts)
    theirs = int(_capacity(gates, torch.tensor(factor * k), torch.tensor(floor)))
    assert views.capacity(tokens, experts, k, factor, floor) == theirs


def test_top1_drops_exactly_the_routes_over_capacity():
    for factor in (0.5, 1.0, 2.0):
        r = moe.routing(1, factor, 64)
        assert r["capacity"] == max(math.ceil(64 / 4 * factor), 4)
        assert r["dropped_tokens"] == sum(max(0, c - r["capacity"]) for c in r["counts"])


def test_the_expert_list_block_runs_only_the_chosen_experts():
    block = moe.ExpertListBlock(hidden=8, ffn=12, experts=4, top_k=1)
    called = set()
    for i, expert in enumerate(block.experts):
        expert.register_forward_hook(lambda mod, inp, out, i=i: called.add(i))
    x = torch.randn(1, 3, 8)
    chosen = torch.topk(block.gate(x.reshape(-1, 8)), 1, dim=-1).indices.unique().tolist()
    block(x)
    assert called == set(chosen) and len(called) <= 3


def test_gloos_complaint_is_found_in_each_ranks_log():
    logs = {0: "[rank0]: RuntimeError: [/x/pair.cc:537] Read error [127.0.0.1]:1: Connection reset by peer. more",
            1: "terminate called\n  what():  [enforce fail at /x/pair.cc:456] op.preamble.length <= op.nbytes. 1584 vs 32. "
               "Received data size doesn't match expected size. Is there a distributed collective mismatch in your code?",
            2: "nothing here"}
    said = views.gloo_complaint(logs)
    assert set(said) == {0, 1}
    assert "collective mismatch" in said[1] and said[0].endswith("Connection reset by peer")


def test_the_optimizer_check_reads_the_groups_deepspeed_needs_before_any_rank_starts():
    """Exercise 2's refusal before a launch: expert parameters mixed with others, unmarked, or in a group named after
    no expert group; a config with its own optimizer. Groups built right pass, whatever their settings (those the
    launch measures)."""
    import torch
    from deepspeed.moe.utils import is_moe_param

    def built(mark=True, name=None, mixed=False, config=None):
        def moe_zero2(model):
            experts = [p for p in model.parameters() if is_moe_param(p)]
            others = [p for p in model.parameters() if not is_moe_param(p)]
            if mixed:
                groups = [{"params": others + experts, "moe": mark, "name": "ep_size_2"}]
            else:
                groups = [{"params": others}, {"params": experts, "moe": mark, "name": name or experts[0].group_name}]
            return config or {"zero_optimization": {"stage": 2}}, torch.optim.AdamW(groups, lr=1e-3)
        return moe_zero2

    assert views.optimizer_problem(built()) is None
    assert "not marked" in views.optimizer_problem(built(mark=False))
    assert "named 'experts'" in views.optimizer_problem(built(name="experts"))
    assert "together" in views.optimizer_problem(built(mixed=True))
    assert "optimizer section" in views.optimizer_problem(built(config={"optimizer": {"type": "AdamW"}}))


@pytest.mark.parametrize("section, said", [({"classes": ["ExpertListBlock"]}, None), ({"name_suffixes": ["mlp"]}, None),
                                           ({"classes": ["OlmoeDecoderLayer"]}, "holds more than"),
                                           ({"classes": ["OlmoeSparseMoeBlock"]}, "no module"),
                                           ({"name_suffixes": ["experts"]}, "never runs"),
                                           ({"names": ["model.layers"]}, "never runs"),
                                           ({"names": ["model.layers.0.mlp"]}, "not inside"),
                                           ({"classes": ["Linear"]}, "not inside"),
                                           ({"class": ["ExpertListBlock"]}, "config class refuses"),
                                           (["ExpertListBlock"], "return a dict")])
def test_the_leaf_check_marks_the_leaves_as_deepspeed_does(section, said):
    """Exercise 3's refusal before a launch, with DeepSpeed's own config class and matching on the expert-list model: a
    leaf must hold each sparse block whole, run its own forward and hold no more than the block (a decoder layer holds
    its attention too)."""
    got = views.leaf_problem(section)
    assert got is None if said is None else said in got


def test_section_5s_sequences_count_up_and_the_expert_lists_get_random_ids():
    """The ZeRO-3 runs' data: each sequence counts up by one from a random start, wrapping past the last id to the
    first one that is not a special token, so the next token always follows from the one before; the expert-list
    model's ids are random, within the same ids, new every step."""
    ids = moe.lm_batch(0, 1, micro=8, tokens=moe.VOCAB)
    assert ids.min() >= moe.FIRST_ID and ids.max() < moe.VOCAB
    after = moe.FIRST_ID + (ids[:, :-1] - moe.FIRST_ID + 1) % (moe.VOCAB - moe.FIRST_ID)
    assert torch.equal(ids[:, 1:], after)
    assert not torch.equal(ids, moe.lm_batch(1, 1, micro=8, tokens=moe.VOCAB)), "another step, other starts"
    assert views.random_id_loss() == pytest.approx(math.log(125))
    ids = moe.random_ids(0, 1)
    assert ids.shape == (1, moe.LIST_TOKENS) and ids.min() >= moe.FIRST_ID and ids.max() < moe.VOCAB
    assert not torch.equal(ids, moe.random_ids(1, 1))


def test_a_launch_that_failed_is_not_reported_as_finished(tmp_path):
    """Section 5's launch fails on purpose and is returned with check=False: its last line says it failed, with the
    exit code and the ranks that got to the end, and reads the launcher's line for the rank that ended it."""
    from course_utils.common import run_folder
    from course_utils.kernel.launch.failures import finished_message
    from course_utils.kernel.launch.result import LaunchResult

    (tmp_path / run_folder.FINISHED).mkdir()
    (tmp_path / run_folder.FINISHED / "rank0").write_text("")
    failed = LaunchResult(returncode=250, log="", records=[], run_dir=tmp_path, command="", seconds=19.1, world_size=2)
    said = finished_message(failed)
    assert not said.startswith("✔") and "exit code 250" in said and "1 of 2 ranks finished" in said
    assert finished_message(LaunchResult(returncode=0, log="", records=[], run_dir=tmp_path, command="", seconds=1.0,
                                         world_size=2)).startswith("✔ 2 ranks finished")
    log = ("[launcher] [ERROR] [launch.py:259:sigkill_handler] ['/x/python', '-u', 'scripts/15_moe_zero3.py', "
           "'--local_rank=1', '--steps', '6'] exits with return code = -6")
    assert views.launcher_exit(log) == -6 and views.launcher_exit("all well") is None
    aborted = "terminate called after throwing an instance of 'gloo::EnforceNotMet'\n  what():  [enforce fail"
    assert views.native_aborts({0: "Connection reset by peer", 1: aborted}) == {
        1: "terminate called after throwing an instance of 'gloo::EnforceNotMet'"}


def test_the_zero3_table_takes_a_run_rank_0_did_not_live_to_record_from_another_rank():
    """gloo aborts whichever rank receives the mismatched gather in section 5's last run: when that is rank 0, rank 1's
    record of the run is the one the table shows; every other run stays rank 0's."""
    from course_utils.common.records.moe import Zero3Run

    def run(label, rank, outcome="trained", losses=(4.9, 4.8)):
        value = {"label": label, "family": "OLMoE", "block": "ExpertListBlock", "leaf_section": None,
                 "leaf_modules": 0, "blocks": 2, "outcome": outcome, "losses": list(losses)}
        return {"name": Zero3Run.NAME, "rank": rank, "value": value}

    records = [run("OLMoE, no leaf module", 0), run("OLMoE, no leaf module", 1, losses=(9.0,)),
               run("expert lists, no leaf module", 1, outcome="RuntimeError: Connection reset by peer", losses=())]
    rows = {r["run"]: r for r in views.zero3_rows(records)}
    assert list(rows) == ["OLMoE, no leaf module", "expert lists, no leaf module"]
    assert rows["OLMoE, no leaf module"]["losses"] == [4.9, 4.8] and rows["expert lists, no leaf module"]["outcome"] == "RuntimeError"
