"""Real models at real size, without weights: each built from its published shape on PyTorch's ``meta`` device
(tensors with a shape and no storage: nothing downloaded, no memory used, a quarter of a second for 8 B parameters).
What is counted is the model transformers builds from that config, not a figure copied from a model card; the
model card's figure is kept beside it, with its source, and :func:`published_gap` compares them."""
from __future__ import annotations

import functools
from dataclasses import dataclass


@dataclass(frozen=True)
class RealModel:
    name: str
    cls: str                  # transformers class
    config_cls: str
    config: dict              # the published shape
    published: float          # the parameter count its authors publish
    published_digits: float   # the precision they publish it with (±)
    source: str
    tokens_per_sample: int    # the sequence length the projections assume
    active_published: float | None = None   # MoE: parameters used per token, as published


REAL_MODELS = {m.name: m for m in (
    RealModel("GPT-2 XL", "GPT2LMHeadModel", "GPT2Config",
              dict(n_embd=1600, n_layer=48, n_head=25, vocab_size=50257, n_positions=1024),
              1.5e9, 0.1e9, "OpenAI's gpt2-xl model card: \"the 1.5B parameter version of GPT-2\"", 1024),
    RealModel("Llama-3-8B shape", "LlamaForCausalLM", "LlamaConfig",
              dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                   num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192, tie_word_embeddings=False),
              8.03e9, 0.005e9, "Meta Llama 3 8B on the Hugging Face Hub: model size 8.03B params (config.json's shape)", 4096),
    RealModel("Mixtral-8x7B shape", "MixtralForCausalLM", "MixtralConfig",
              dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                   num_key_value_heads=8, vocab_size=32000, num_local_experts=8, num_experts_per_tok=2,
                   tie_word_embeddings=False),
              46.7e9, 0.05e9, "Mistral AI, \"Mixtral of experts\" (2023): 46.7B total parameters, 12.9B used per token",
              4096, active_published=12.9e9),
    RealModel("T5-3B", "T5ForConditionalGeneration", "T5Config",
              dict(d_model=1024, d_ff=16384, d_kv=128, num_heads=32, num_layers=24, num_decoder_layers=24,
                   vocab_size=32128, feed_forward_proj="relu", tie_word_embeddings=True),
              2.8e9, 0.1e9, "Raffel et al., T5 (JMLR 2020), section 3.7: d_ff 16,384 and 32 heads, "
                             "\"around 2.8 billion parameters\"", 512),
)}


@dataclass(frozen=True)
class Size:
    """What a projection needs of a model, read from the model transformers built on the ``meta`` device."""
    name: str
    params: int                    # every parameter, counted once (tied weights once)
    largest_param: int             # elements of the largest parameter
    largest_layer: int             # the largest module's own parameters: what ZeRO-3 gathers at once, as DeepSpeed's
    #                                estimators count it (planning.largest_layer_params)
    embedding_params: int          # input embeddings (a lookup, no matmul)
    expert_params: int             # MoE experts, all of them
    experts: int
    top_k: int
    layers: int
    hidden: int
    tokens_per_sample: int

    @property
    def active_params(self) -> float:
        """Parameters a token passes through: the experts count top_k / experts of theirs."""
        if not self.experts:
            return float(self.params)
        return self.params - self.expert_params * (1 - self.top_k / self.experts)

    @property
    def matmul_params(self) -> float:
        """Parameters a token multiplies with (the input embedding is a lookup); 2 FLOPs each in forward."""
        return self.active_params - self.embedding_params


def build(name: str):
    """The model, on the ``meta`` device."""
    import torch
    import transformers

    m = REAL_MODELS[name]
    config = getattr(transformers, m.config_cls)(**m.config)
    with torch.device("meta"):
        return getattr(transformers, m.cls)(config)


@functools.cache
def size(name: str) -> Size:
    if name not in REAL_MODELS:
        raise KeyError(f"no real model named {name!r}; the course has {', '.join(REAL_MODELS)}")
    m = REAL_MODELS[name]
    model = build(name)
    named = dict(model.named_parameters())          # tied weights appear once
    embeddings = {id(mod.weight) for mod in model.modules() if type(mod).__name__ == "Embedding"}
    output = model.get_output_embeddings()
    output_id = id(output.weight) if output is not None else None
    experts = [p for n, p in named.items() if ".experts." in n]
    cfg = m.config
    return Size(
        name=name, params=sum(p.numel() for p in named.values()),
        largest_param=max(p.numel() for p in named.values()),
        largest_layer=max(sum(p.numel() for p in mod.parameters(recurse=False)) for mod in model.modules()),
        # a tied input embedding is also the LM head, a matmul: it stays in the matmul count
        embedding_params=sum(p.numel() for p in named.values() if id(p) in embeddings and id(p) != output_id),
        expert_params=sum(p.numel() for p in experts), experts=cfg.get("num_local_experts", 0),
        top_k=cfg.get("num_experts_per_tok", 0),
        layers=cfg.get("num_hidden_layers", cfg.get("n_layer", cfg.get("num_layers", 0))),
        hidden=cfg.get("hidden_size", cfg.get("n_embd", cfg.get("d_model", 0))),
        tokens_per_sample=m.tokens_per_sample)


def published_gap(name: str) -> float:
    """The meta-device count minus the published figure, in units of the figure's published precision (|x| ≤ 1:
    they agree)."""
    m = REAL_MODELS[name]
    return (size(name).params - m.published) / m.published_digits


def table():
    """Every real model: counted here, as published (with its source), the largest parameter, MoE's active share."""
    import pandas as pd

    rows = []
    for name, m in REAL_MODELS.items():
        s = size(name)
        rows.append({"model": name, "parameters (meta device)": s.params, "published": f"{m.published / 1e9:g} B",
                     "largest parameter": s.largest_param, "largest module (ZeRO-3 gathers it whole)": s.largest_layer,
                     "layers": s.layers, "hidden": s.hidden,
                     "used per token": s.active_params, "source of the published figure": m.source})
    return pd.DataFrame(rows).set_index("model")


def zero_bytes_table(gpus: tuple = (1, 8, 64), dtype: str = "bf16"):
    """GB of model states per GPU for every real model at ZeRO stages 0–3 on 1, 8 and 64 GPUs (the paper's formula,
    :func:`course_utils.common.zero_rules.zero_formula`, notebook 03 checked it against measured bytes), beside
    DeepSpeed's own stage-3 estimate (which allows 4 bytes × the largest module gathered whole)."""
    import pandas as pd

    from course_utils.common.zero_rules import zero_formula
    from course_utils.kernel.planning import estimator_rows

    rows = []
    for name in REAL_MODELS:
        s = size(name)
        for n in gpus:
            row = {"model": name, "GPUs": n}
            row.update({f"stage {k} GB": zero_formula(s.params, k, n, dtype)["total"] / 1e9 for k in range(4)})
            est = next(r for r in estimator_rows(s.params, s.largest_layer, n, 1) if r["stage"] == 3
                       and not r["offload_optimizer"] and r["zero_init"])
            row["DeepSpeed's stage-3 estimate GB"] = est["gpu_bytes"] / 1e9
            rows.append(row)
    return pd.DataFrame(rows).set_index(["model", "GPUs"])
