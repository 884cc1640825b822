"""Notebook 16's long sequence without a launch: the tokens for a limit, how the rank's records become trained / out of
memory, the growth per block and the plain forward's projected need, and what contradicts the section's text."""
from course_utils.common.records.bigger import Limit
from course_utils.common.records.bigger_sequence import (CHECKPOINTED, PLAIN, SHORT, BlockMemory, Pass, PassResult,
    passes)
from course_utils.kernel.views import bigger_sequence as views
from course_utils.kernel.views.bigger_sequence import tokens_for

MiB = 2**20
KILLED = "Rank 0 was killed by SIGKILL (exit status -9) and left no Python traceback: with no traceback ..."


def outcome(error: str | None = KILLED, plain_blocks: int = 8, checkpointed: int = 16) -> views.SequenceOutcome:
    """A CPU launch as the rank records it: every pass started, the first two trained, the plain one ended after
    ``plain_blocks`` blocks of 28 MiB each (a checkpointed block keeps 1 MiB)."""
    o = views.SequenceOutcome(352, 256, 2048, Limit("cgroup", 352 * MiB, "cpu"), error=error)
    for name, tokens, on in passes(256, 2048):
        o.passes.append(Pass(name, tokens, 3_500_288, checkpointed if on else 0, 16, False, True, 100 * MiB))
    o.results = [PassResult(SHORT, 256, 6.2, 0.3, 124 * MiB), PassResult(CHECKPOINTED, 2048, 6.2, 4.0, 153 * MiB)]
    o.blocks = ([BlockMemory(CHECKPOINTED, k, (104 + k) * MiB) for k in range(16)]
                + [BlockMemory(PLAIN, k, (131 + 28 * k) * MiB) for k in reversed(range(plain_blocks))])
    return o


def test_the_cpu_sizes_and_the_gpu_s_grow_with_the_limit():
    assert tokens_for(352, False) == (256, 2048)
    short, long = tokens_for(17_800, True)          # an eighth of an H200
    assert long & (long - 1) == 0 and long >= 2 * 2048 * 17_800 / 352 and short == long // 8
    assert tokens_for(100, True)[1] == 2048         # never below the CPU's long sequence


def test_the_records_say_how_each_pass_ended():
    o = outcome()
    assert o.statuses == {SHORT: "trained", CHECKPOINTED: "trained", PLAIN: "out of memory"}
    assert views.problem(o) is None
    assert outcome(error="Rank 0 failed (launch exit code 1): ValueError").statuses[PLAIN] == "failed"
    assert "passes ended" in views.problem(outcome(error=None))
    assert "left blocks" in views.problem(outcome(checkpointed=12))


def test_the_plain_forward_s_need_is_projected_from_its_growth_per_block():
    o = outcome()
    assert o.curve(PLAIN)[0] == 131 * MiB          # in block order, whatever order the records came in
    assert views.growth_per_block(o, CHECKPOINTED) == MiB and views.growth_per_block(o, PLAIN) == 28 * MiB
    assert views.forward_need(o) == (131 + 28 * 7 + 28 * 8) * MiB
    assert views.forward_need(outcome(plain_blocks=1)) is None


def test_the_message_s_head_and_the_recorded_figures():
    o = outcome(error=KILLED + "\n--- rank 0 (last lines) ---\nlong, not checkpointed (2048 tokens): ...\nLogs: x")
    assert views.message_head(o) == KILLED
    figures = views.record(o)
    assert figures["error_first_line"] == "Rank 0 was killed by SIGKILL (exit status -9) and left no Python traceback"
    assert figures["statuses"][PLAIN] == "out of memory" and figures["forward_need"] == views.forward_need(o)
    assert "3.5 M parameters (16 B/parameter = 53 MiB)" in views.summary(o)
    assert views.message_head(outcome(error=None)) == "" and views.record(outcome(error=None))["error_first_line"] is None
