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
