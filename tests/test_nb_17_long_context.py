"""Notebook 17 executed with papermill: Ulysses sequence parallelism for a Hugging Face model (ALST) on 2 ranks against
one process, the tutorial's sharding, the all-to-all bytes, the longest sequence under a limit at SP 1, 2 and 4, tiling,
and the Trainer route. Every formula is recomputed here from the model's shape, written out below."""
import pytest

from conftest import run_notebook

NAME = "17_long_context"
pytestmark = pytest.mark.notebook

LAYERS, HEADS, KV_HEADS, HEAD_DIM, PROMPT = 2, 4, 2, 16, 64      # the tiny Llama of course_utils/rank/long_context.py


def alltoall(seq_len: int, sp: int, dtype_bytes: int = 4) -> dict[str, int]:
    """One step's all_to_all_single messages per rank, {bytes: count}: q, k, v and the output, forward and backward."""
    out: dict[str, int] = {}
    kv = max(KV_HEADS, sp)
    for numel in (seq_len // sp * HEADS * HEAD_DIM, seq_len // sp * kv * HEAD_DIM, seq_len // sp * kv * HEAD_DIM,
                  seq_len * HEADS // sp * HEAD_DIM):
        key = str(numel * dtype_bytes)
        out[key] = out.get(key, 0) + 2 * LAYERS
    return out


def test_sequence_parallel_training_limits_tiling_and_the_trainer():
    m = run_notebook(NAME)
    L, tol = m["seq_len"], m["loss_tolerance"]
    # one process's training, learning
    ref = m["reference_losses"]
    assert ref[-1] < ref[0] - 0.2
    # SP 2 with DeepSpeed's adapter and transformers' loss: one process's losses and gradients; the tutorial's are not
    assert m["sp_loss_gap"] <= tol < m["tutorial_loss_gap"]
    assert abs(m["grad_norm_ratio"]["adapter"] - 1) <= tol
    assert m["tokens_per_rank"] == {"adapter": [L // 2, L // 2], "tutorial": [L // 2, L // 2]}
    # labelled tokens: L − 1 next tokens, minus the prompt's, split at the cut; the tutorial loses rank 0's last one
    assert m["labelled_per_rank"]["adapter"] == [L // 2 - (PROMPT - 1), L // 2 - 1]
    assert m["labelled_per_rank"]["tutorial"] == [L // 2 - PROMPT, L // 2 - 1]
    assert m["your_loss_gap"] <= tol and abs(m["your_grad_norm_ratio"] - 1) <= tol
    # DeepSpeed's head rules, in its own words
    rules = {(r["query heads"], r["key/value heads"]): r["DeepSpeed"] for r in m["head_rules"]}
    assert rules[(3, 1)].startswith("Attention head count 3 is not divisible by SP size 2")
    assert rules[(4, 3)].startswith("KV attention head count 3 is not divisible")
    assert rules[(4, 1)].startswith("accepted: 2 query and 1 key/value")
    # the all-to-alls the comms logger saw = the formula, for both runs
    for row in m["alltoall"]:
        assert {str(k): v for k, v in row["logged messages {bytes: count}"].items()} == alltoall(L, 2)
    # the longest sequence under the same limit per rank: a count of tensor bytes, the same in every run:
    # grows with SP, by less than SP from 2 to 4, more than the square root of SP from 1 to 4
    longest = {int(k): v for k, v in m["longest_sequence"].items()}
    assert longest[1] < longest[2] < longest[4] < 2 * longest[2] and 2 * longest[1] < longest[4] < 4 * longest[1]
    assert m["predicted_sp4_longest"] >= longest[4]
    for sp, peaks in m["peaks"].items():
        assert all(peak < m["cap_mb"] * 2**20 for peak in peaks.values())
    # at the same length a rank of SP 2 holds less than SP 1's rank, and SP 4's less than SP 2's
    p = {int(sp): {int(n): v for n, v in peaks.items()} for sp, peaks in m["peaks"].items()}
    assert p[2][1024] < p[1][1024] and p[4][1536] < p[2][1536]
    # tiling: the same loss and gradients, each tiling a smaller peak, both the smallest
    tiling = {r["setting"]: r for r in m["tiling"]}
    assert max(r["max |Δ grad|"] for r in tiling.values()) < 1e-6
    assert tiling["both"]["pass peak MiB"] < min(tiling["TiledMLP"]["pass peak MiB"],
                                                 tiling["TiledFusedLogitsLoss"]["pass peak MiB"])
    assert max(tiling["TiledMLP"]["pass peak MiB"], tiling["TiledFusedLogitsLoss"]["pass peak MiB"]) \
        < tiling["plain"]["pass peak MiB"]
    # the Trainer with ParallelismConfig: one process's losses, every SP rank on every sample in order
    assert m["trainer_loss_gap"] <= tol
    assert m["trainer_samples"] == [list(range(len(ref)))] * 2
    assert m["trainer_parallelism"]["sp_size"] == 2
    # Llama-3-8B shape: the all-to-all formula in bf16 over 8 GPUs, and a small share of the step
    first = m["llama8b_alltoall"][0]
    seq, sp = first["sequence"], first["SP"]
    sent = 2 * 32 * 2 * seq // sp * 128 * (2 * 32 + 2 * max(8, sp)) * (sp - 1) / sp
    assert first["all-to-all GB sent per GPU"] == pytest.approx(sent / 1e9)
    assert all(r["all-to-all ÷ compute"] < 0.05 for r in m["llama8b_alltoall"])
