"""Notebook 17's memory launches without a launch: what the ranks' limit counts, how the ranks' records become
trained / out of memory and a cost per token, what the attention probe reads, that ALST's tiled logits+loss equals the plain loss only when the mean is
taken inside the shards, and that the tiled MLP is patched on one model only."""
import pytest
import torch

from course_utils.common.records.bigger import Limit
from course_utils.common.records.long_context_memory import CAP_MB, LENGTHS, LengthAttempt, LengthRefused, LengthTrial
from course_utils.kernel.views import long_context_memory as views
from course_utils.rank import long_context as lc
from course_utils.rank import sequence_memory as sm

MiB = 2**20
REFUSED = "Rank 1 exited with code 1: 2048 tokens: torch.OutOfMemoryError: aten.mm.default took this rank's tensors to 131.8 MiB, past its limit of 130 MiB"


def trial(sp: int, length: int, peak: int, held: int = 10 * MiB, heads=(4, 2)) -> LengthTrial:
    shape = [1, heads[0], length, 16]
    return LengthTrial(sp, length, length // sp, peak, held, [0.1], [7.0],
                       {"query": shape, "key": [1, heads[1], length, 16], "value": [1, heads[1], length, 16],
                        "element_size": 4})


def outcome(sp: int, lengths: list[int], trained: dict[int, int], error: str | None = REFUSED,
            refused: bool = True) -> views.SpOutcome:
    """A launch of ``sp`` ranks that attempted ``lengths`` and trained those in ``trained`` (length → peak) on every
    rank; with ``refused``, every rank's limit recorded its refusal of the last length."""
    trials = [trial(sp, n, peak) for n, peak in trained.items() for _ in range(sp)]
    refusals = [LengthRefused(sp, lengths[-1], "aten.mm.default", 131 * MiB, CAP_MB * MiB)] * sp if refused else []
    o = views.SpOutcome(sp, CAP_MB, [Limit("tensor", CAP_MB * MiB, "cpu")] * sp,
                        [LengthAttempt(sp, n) for n in lengths], trials, error=error, refusals=refusals)
    o.statuses = views.statuses(o.attempts, o.trained, [r.length for r in refusals])
    return o


def test_the_length_the_limit_stopped_is_out_of_memory_and_the_longest_is_the_last_trained():
    o = outcome(2, [1024, 2048, 4096], {1024: 30 * MiB, 2048: 50 * MiB})
    assert o.statuses == {1024: views.TRAINED, 2048: views.TRAINED, 4096: views.OUT_OF_MEMORY}
    assert o.longest == 2048 and o.peak(2048) == 50 * MiB
    assert "4096 tokens ( 2048 a rank): out of memory — aten.mm.default took a rank's tensors to 131.0 MiB" \
        in views.summary(o) and "the launch failed" not in views.summary(o)
    failed = outcome(2, [1024], {}, error="Rank 0 failed: ValueError: batch's seqlen=1000 isn't divisible by sp-size=2",
                     refused=False)
    assert failed.statuses == {1024: views.FAILED} and failed.longest is None
    assert "the launch failed: Rank 0 failed: ValueError" in views.summary(failed)


def test_a_length_counts_as_trained_only_when_every_rank_recorded_it():
    o = outcome(4, [1024, 2048], {1024: 20 * MiB})
    o.trials.append(trial(4, 2048, 30 * MiB))          # one rank of four finished 2048, then the limit ended another
    assert o.trained == [1024]


def test_the_attention_probe_reads_the_heads_a_rank_holds_over_the_whole_length():
    heads = views.attention_heads(trial(4, 8192, 0, heads=(1, 1)))
    assert heads == {"query heads": 1, "key/value heads": 1, "length": 8192, "bytes a token a layer": 3 * 16 * 4}
    seen = []
    q, k = torch.randn(1, 4, 32, 16), torch.randn(1, 2, 32, 16)
    with sm.attention_inputs(seen):
        out = torch.nn.functional.scaled_dot_product_attention(q, k, k, is_causal=True, enable_gqa=True)
    assert seen == [{"query": [1, 4, 32, 16], "key": [1, 2, 32, 16], "value": [1, 2, 32, 16], "element_size": 4}]
    assert torch.nn.functional.scaled_dot_product_attention.__name__ == "scaled_dot_product_attention"
    assert out.shape == q.shape
    with pytest.raises(ValueError, match="kernel"):
        with sm.attention_kernel("flash"):
            pass


def test_every_length_cuts_into_whole_periods_on_every_sp_size():
    assert all(n % (max(views.SP_SIZES) * lc.PERIOD) == 0 for n in LENGTHS) and list(LENGTHS) == sorted(LENGTHS)


def test_lengths_that_do_not_cut_evenly_or_do_not_grow_are_refused_before_any_launch():
    with pytest.raises(ValueError, match="multiple of 256"):
        views.longest_sequence(2, lengths=[1000])
    with pytest.raises(ValueError, match="ascending"):
        views.longest_sequence(2, lengths=[2048, 1024])
    with pytest.raises(ValueError, match="kernel"):
        views.longest_sequence(2, kernel="flash")


def test_the_limit_counts_new_storages_once_until_torch_frees_them():
    from course_utils.rank.tensor_bytes import TensorBytes

    before = torch.ones(256)                      # allocated before counting began: never counted
    with TensorBytes() as counter:
        a = torch.zeros(1000)                     # 4000 bytes
        view = a.view(10, 100)
        a.add_(1)                                 # a view and an in-place result: the same storage
        b = before[:10] * 2                       # a view of an uncounted storage adds nothing; the product 40 bytes
        empty = torch.empty(0)
        empty.resize_(500)                        # resized in place: counted at its new size, 2000 bytes
        assert counter.count == 4000 + 40 + 2000
        del a, view
        assert counter.count == 2040
        before.mul_(2)                            # in place on an uncounted storage
        del before, b, empty
        assert counter.count == 0 and counter.peak == 6040
        counter.reset_peak()
        x = torch.randn(64, 64, requires_grad=True)
        (x @ x).softmax(-1).sum().backward()      # the backward's tensors are counted too, in this thread
        assert counter.peak > 3 * 64 * 64 * 4 and counter.count == 2 * 64 * 64 * 4    # x and its gradient are left


def test_past_its_cap_an_allocation_raises_torch_out_of_memory_and_the_count_is_exact():
    from course_utils.rank.tensor_bytes import TensorBytes

    with TensorBytes(cap_bytes=10_000) as counter:
        kept = torch.zeros(2000)                  # 8000 bytes: under the cap
        with pytest.raises(torch.OutOfMemoryError, match="past its limit"):
            torch.zeros(1000)                     # 12000 > 10000
        assert counter.count == 8000 and kept.numel() == 2000     # the refused tensor was never handed out
        assert counter.refused[0].startswith("aten.") and counter.refused[1] == 12000   # what the rank records


def hidden_and_labels(length: int = 256):
    model = lc.build()
    sample = lc.sample(0, length)
    labels = torch.nn.functional.pad(sample["labels"], (0, 1), value=-100)[1:][None]
    hidden = model.model(input_ids=sample["input_ids"][None],
                         position_ids=sample["position_ids"][None]).last_hidden_state.detach().requires_grad_()
    return model, hidden, labels


def test_the_tiled_logits_loss_gives_the_plain_mean_and_gradients():
    model, hidden, labels = hidden_and_labels()
    total, count = lc.token_loss_sum(model.lm_head(hidden), labels)
    (total / count).backward()
    plain = float(total.detach() / count), hidden.grad.clone(), model.lm_head.weight.grad.clone()
    hidden.grad, model.lm_head.weight.grad = None, None
    tiled = sm.tiled_logits_loss(model, hidden, labels, shards=4)
    tiled.backward()
    assert float(tiled.detach()) == pytest.approx(plain[0], abs=1e-5)
    assert torch.allclose(hidden.grad, plain[1], atol=1e-7) and torch.allclose(model.lm_head.weight.grad, plain[2],
                                                                               atol=1e-6)


def test_dividing_the_tiled_sum_afterwards_leaves_the_lm_head_gradient_unscaled():
    """Why :func:`sm.tiled_logits_loss` divides inside the shards: ``TiledFusedLogitsLoss`` computes the LM head's
    gradient in its forward with an incoming gradient of 1 and scales only the hidden states' gradient by what comes
    from above (``TiledFusedLogitsLoss.backward``)."""
    from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledFusedLogitsLoss

    model, hidden, labels = hidden_and_labels()
    count = (labels != -100).sum()
    reference = sm.tiled_logits_loss(model, hidden, labels, shards=4)
    reference.backward()
    right = model.lm_head.weight.grad.clone()
    model.lm_head.weight.grad = None
    summed = TiledFusedLogitsLoss.apply(lambda head, x, y: lc.token_loss_sum(head(x), y)[0], model.lm_head, hidden,
                                        labels, None, 4, [model.lm_head.weight], "sum")
    (summed / count).backward()
    assert float(summed.detach() / count) == pytest.approx(float(reference.detach()), abs=1e-5)
    assert torch.allclose(model.lm_head.weight.grad, right * count, rtol=1e-4)


def test_the_tiled_mlp_is_patched_on_one_model_only_and_removed_after():
    model, other = lc.build(), lc.build()
    x = torch.randn(1, 300, model.config.hidden_size, requires_grad=True)
    plain = model.model.layers[0].mlp(x)
    with sm.tiled_mlps(model):
        assert "forward" in vars(model.model.layers[0].mlp) and "forward" not in vars(other.model.layers[0].mlp)
        tiled = model.model.layers[0].mlp(x)
    assert "forward" not in vars(model.model.layers[0].mlp)
    assert tiled.grad_fn.name() == "TiledMLPBackward" and torch.allclose(tiled, plain, atol=1e-6)
    assert sm.mlp_shards(300, 64) == 5
