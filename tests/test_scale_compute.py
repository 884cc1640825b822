"""Real scale for notebooks 11 and 13 (``course_utils.kernel.scale.compute``): each formula against a count written out
by hand or measured on a tiny model here (torch's FlopCounterMode for FLOPs, torch's MemTracker for the bytes a
forward keeps), never against the value it was computed from."""
import pytest
import torch

from course_utils.common.records.parallel import Bubble, StageBytes
from course_utils.kernel.scale import compute, counts, models


def tiny(family: str, dtype=torch.float32):
    """A 2-layer model of ``family`` with sizes whose terms cannot be mistaken for each other, eager attention (so
    that FlopCounterMode sees its matmuls), and the :class:`compute.Decoder` of the same sizes."""
    import transformers

    torch.manual_seed(0)
    if family == "GPT-2":
        config = transformers.GPT2Config(vocab_size=96, n_positions=32, n_embd=48, n_layer=2, n_head=4,
                                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        model = transformers.GPT2LMHeadModel(config)
        dec = compute.Decoder("tiny", "GPT-2", 2, 48, 192, 4, 48, 96)
    else:
        config = transformers.LlamaConfig(hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, vocab_size=96,
                                          max_position_embeddings=64, tie_word_embeddings=False)
        model = transformers.LlamaForCausalLM(config)
        dec = compute.Decoder("tiny", "Llama", 2, 64, 176, 4, 32, 96)
    model = model.to(dtype)
    model.config.use_cache = False
    model.train()
    return model, dec


def flops(model, ids, checkpointing: str | None = None) -> tuple[float, float]:
    """Forward and backward FLOPs of one pass, counted by torch's FlopCounterMode (eager attention)."""
    from torch.utils.flop_counter import FlopCounterMode

    model.set_attn_implementation("eager")
    if checkpointing:
        model.activation_checkpointing_enable({"use_reentrant": checkpointing == "reentrant"})
    with FlopCounterMode(display=False) as forward:
        loss = model(input_ids=ids, labels=ids).loss
    with FlopCounterMode(display=False) as backward:
        loss.backward()
    model.zero_grad(set_to_none=True)
    return forward.get_total_flops(), backward.get_total_flops()


def test_decoder_sizes_match_the_models_transformers_builds():
    toy = compute.toy()
    assert toy.matmul_params == 6 * 12 * 384 ** 2 + 8192 * 384 == 13_762_560         # blocks' weights + tied head
    llama = compute.real("Llama-3-8B shape")
    assert (llama.ffn, llama.kv_hidden, llama.vocab) == (14336, 1024, 128256)
    # the meta-device count's matmul parameters hold the RMSNorm weights too: 2 a layer and the final one
    assert llama.matmul_params == models.size("Llama-3-8B shape").matmul_params - (2 * 32 + 1) * 4096
    for family in ("GPT-2", "Llama"):
        model, dec = tiny(family)
        weights = sum(m.weight.numel() for m in model.modules()
                      if type(m).__name__ in ("Linear", "Conv1D") and m.weight.dim() == 2)
        assert dec.matmul_params == weights, family
    with pytest.raises(ValueError, match="dense decoders"):
        compute.real("Mixtral-8x7B shape")


@pytest.mark.parametrize("family", ["GPT-2", "Llama"])
def test_forward_backward_and_recompute_flops_match_torchs_count(family):
    model, dec = tiny(family)
    seq = 8
    ids = torch.randint(0, 96, (2, seq))
    forward, backward = flops(model, ids)
    assert counts.forward_flops(dec.matmul_params, 2 * seq, dec.layers, dec.hidden, seq) == forward
    assert counts.step_flops(forward) == forward + backward                 # a backward is twice the forward
    _, early = flops(model, ids, "non-reentrant")           # transformers' default: torch stops each rerun early
    assert compute.blocks_share(dec, seq, early_stop=True) == pytest.approx((early - backward) / forward)
    model, _ = tiny(family)
    _, whole = flops(model, ids, "reentrant")               # reruns each whole block, as deepspeed.checkpointing does
    assert compute.blocks_share(dec, seq) == pytest.approx((whole - backward) / forward)
    assert counts.step_flops(forward, compute.blocks_share(dec, seq)) == pytest.approx(forward + whole)


def test_deepspeeds_profiler_counts_a_step_as_3_forwards_plus_the_recompute():
    assert compute.profiler_step_factor(0.0) == 3.0
    assert compute.profiler_step_factor(1.0) == 4.0 == counts.step_flops(1.0, recompute=True)
    modules = [{"module": "(whole model)", "fwd_flops": 100}, {"module": "transformer.wte", "fwd_flops": 0},
               {"module": "transformer.h.0", "fwd_flops": 30}, {"module": "transformer.h.1", "fwd_flops": 30},
               {"module": "lm_head", "fwd_flops": 40}]
    assert compute.measured_blocks_share(modules) == 0.6


@pytest.mark.parametrize("family,dtype", [("GPT-2", torch.float32), ("Llama", torch.bfloat16)])
def test_kept_bytes_per_token_match_torchs_memory_tracker(family, dtype):
    """What the forward keeps (MemTracker's activations after it) against the formula; the few bytes per sequence the
    formula leaves out (position ids, Llama's rotary cos and sin, shared by the batch's sequences) stay under 1 % at 8
    sequences of 16 tokens."""
    from course_utils.rank.perf import activation_memory, set_checkpointing

    model, dec = tiny(family, dtype)
    ids = torch.randint(0, 96, (8, 16))
    for how in ("off", "hf"):
        set_checkpointing(model, how)
        kept = activation_memory(model, ids).after_forward["Activation"] / ids.numel()
        b = 4 if dtype == torch.float32 else 2
        assert compute.kept_per_token(dec, b, how == "hf")["total"] == pytest.approx(kept, rel=0.01), (family, how)


def test_kept_bytes_of_a_llama_layer_written_out():
    """Per token and layer in bf16: two RMSNorms (fp32 copy 4h, 1/rms 4, normalised 2h, output 2h), q k v after rotary
    (2h + 2·2·kv), attention's output 2h, a log-sum-exp per head (4 bytes), SwiGLU's four tensors (4·2·f)."""
    llama = compute.real("Llama-3-8B shape")
    h, kv, f, heads = 4096, 1024, 14336, 32
    by_hand = 2 * (4 * h + 4 + 2 * h + 2 * h) + (2 * h + 4 * kv) + 2 * h + 4 * heads + 8 * f
    kept = compute.kept_per_token(llama, 2)
    assert kept["per layer"] == by_hand == 200_840
    assert compute.kept_per_token(llama, 2, checkpointed=True)["per layer"] == 2 * h
    assert kept["outside the layers"] == (4 * h + 4 + 2 * h + 2 * h) + 4 * 128256 + 8


def test_checkpointing_trade_places_states_and_activations_per_gpu():
    rows, projections = compute.checkpointing_trade(tokens=(4096,))
    psi = 8_030_261_248
    one = {r["checkpointing"]: r for r in rows if r["projected on"] == "1 × H100 80 GB"}
    eight = {r["checkpointing"]: r for r in rows if r["projected on"] == "8 × A100 40 GB"}
    assert one["off"]["model states GB"] == pytest.approx(2 * psi / 1e9)          # bf16 weights; Adam on the host
    assert eight["off"]["model states GB"] == pytest.approx(16 * psi / 8 / 1e9)   # ZeRO-3 over 8
    assert eight["on"]["activations GB"] == pytest.approx(4096 * (32 * 8192 + 32772 + 4 * 128256 + 8) / 1e9)
    assert not eight["off"]["fits"] and eight["on"]["fits"] and one["off"]["fits"]
    share = compute.blocks_share(compute.real("Llama-3-8B shape"), 4096, early_stop=True)
    on = next(p for p in projections if p.hardware == "1 × H100 80 GB" and p.assumptions["recompute"])
    off = next(p for p in projections if p.hardware == "1 × H100 80 GB" and not p.assumptions["recompute"])
    assert on.seconds / off.seconds == pytest.approx((3 + share) / 3)


def test_pipeline_agreement_counts_both_stages_and_both_directions():
    bubbles = [Bubble(3, 2, s, 0.3, [0.3], 1.0, 1.0, 2, 8, 2 - s, {}) for s in (0, 1)]
    sent = [StageBytes(3, 0, {"SendActivation": 3 * 128 * 256 * 4}, [128, 256], 4),
            StageBytes(3, 1, {"SendGrad": 3 * 128 * 256 * 4}, [128, 256], 4)]
    rows = compute.pipeline_agreement(bubbles, sent)
    assert [r["formula"] for r in rows] == [0.25, 2 * 3 * 128 * 256 * 4] and all(r["within"] for r in rows)
    one_way = compute.pipeline_agreement(bubbles, sent[:1])
    assert not one_way[1]["within"]


def test_a_pipeline_step_adds_bubble_and_hand_overs_to_its_compute():
    size = models.size("Llama-3-8B shape")
    forward = 2 * size.matmul_params * 4096 + 4 * 32 * 4096 * 4096 * 4096
    rate = 989e12 * 0.4
    p = compute.pipeline_step(size, 4, 8, "H100 80 GB", "InfiniBand NDR 400 Gb/s")
    t = {term.name: term for term in p.terms}
    assert t["compute"].seconds == pytest.approx(8 * 3 * forward / 4 / rate)
    assert t["bubble"].seconds == pytest.approx(3 * 3 * forward / 4 / rate)
    assert t["hand-overs"].count == 2 * (8 + 4 - 1) * 4096 * 4096 * 2
    assert t["hand-overs"].seconds == pytest.approx(t["hand-overs"].count / (50e9 * 0.8))
    assert p.seconds == pytest.approx(sum(x.seconds for x in p.terms))
    free = compute.pipeline_step(size, 4, 8, "H100 80 GB", "InfiniBand NDR 400 Gb/s", efficiency=1e12)
    assert compute.idle_share(free) == pytest.approx(3 / 11, abs=1e-6)        # free hand-overs: the formula
    assert compute.idle_share(p) > 3 / 11


def test_pipeline_or_zero3_counts_what_each_gpu_sends():
    rows, projections = compute.pipeline_or_zero3(gpus=(8, 64), tokens_per_gpu=(4096,))
    psi = 8_030_261_248
    eight, sixty_four = rows
    assert eight["ZeRO-3 sends GB (InfiniBand)"] == pytest.approx(3 * 7 / 8 * psi * 2 / 1e9)
    assert eight["pipeline sends GB (InfiniBand)"] == pytest.approx(2 * 8 * 4096 * 4096 * 2 / 1e9)    # m = 8
    assert eight["pipeline sends GB (NVLink)"] == 0
    assert sixty_four["pipeline sends GB (NVLink)"] == pytest.approx(2 * 7 / 8 * psi / 8 * 2 / 1e9)
    zero3 = projections[0]
    assert {t.rate_says.split(":")[0] for t in zero3.terms if t.name == "collectives"} == {"InfiniBand NDR 400 Gb/s"}
    lines = compute.explain(projections, ["H100 80 GB"], across_machines=True)
    assert lines[0].startswith("rates: ") and any("InfiniBand" in line and "ConnectX-7" in line for line in lines)
