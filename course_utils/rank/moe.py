"""A small model around DeepSpeed's MoE layer (``deepspeed.moe.layer.MoE``), its data, and what each rank holds
of it: the pieces ``scripts/15_moe.py`` combines (notebook 15).

The model: a linear layer into ``HIDDEN`` features, the MoE layer (each expert ``Linear → GELU → Linear``, FFN
wide), a residual around it, and a linear classifier. Every expert is initialised from its *global* id, so a model
whose experts are spread over ranks (``ep_size`` > 1) starts from the same weights as one with every expert on
every rank (``ep_size`` = 1), and the two can be compared step by step.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

IN, HIDDEN, FFN, CLASSES = 16, 32, 64, 8
MICRO, SEQ = 4, 16                 # samples of SEQ tokens per rank and step: 64 tokens
SEED = 0


def expert(hidden: int = HIDDEN, ffn: int = FFN) -> nn.Module:
    return nn.Sequential(nn.Linear(hidden, ffn), nn.GELU(), nn.Linear(ffn, hidden))


def expert_numel(hidden: int = HIDDEN, ffn: int = FFN) -> int:
    """Parameters of one expert, counted on a fresh module (not on the layer that holds the experts)."""
    return sum(p.numel() for p in expert(hidden, ffn).parameters())


class MoENet(nn.Module):
    """Input projection, one DeepSpeed MoE layer with a residual around it, classifier. ``forward`` returns the
    logits, the gate's auxiliary loss and its expert counts (the MoE layer's own three outputs, passed on)."""

    def __init__(self, experts: int, ep_size: int, k: int = 1, capacity_factor: float = 1.0, ffn: int = FFN,
                 min_capacity: int = 4):
        from deepspeed.moe.layer import MoE

        super().__init__()
        torch.manual_seed(SEED)
        self.inp = nn.Linear(IN, HIDDEN)
        self.moe = MoE(hidden_size=HIDDEN, expert=expert(HIDDEN, ffn), num_experts=experts, ep_size=ep_size, k=k,
                       capacity_factor=capacity_factor, min_capacity=min_capacity)
        self.out = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x):
        h = torch.relu(self.inp(x))
        m, l_aux, counts = self.moe(h)
        return self.out(h + m), l_aux, counts


def build(experts: int, ep_size: int, **kwargs) -> MoENet:
    """The model with every expert this rank holds initialised from its global id. Which experts those are
    depends on the expert-parallel groups, so they are created here, as ``MoE._create_process_groups`` does when
    ``deepspeed.initialize`` calls it (it then finds them and only hands the layer its group)."""
    from deepspeed.utils import groups

    model = MoENet(experts, ep_size, **kwargs)
    if model.moe.expert_group_name not in groups._get_expert_parallel_group_dict():
        groups._create_expert_and_data_parallel(ep_size)
    for gid, module in zip(local_expert_ids(model), model.moe.deepspeed_moe.experts.deepspeed_experts):
        g = torch.Generator().manual_seed(1000 + gid)
        with torch.no_grad():
            for p in module.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * (0.3 if p.dim() > 1 else 0.05))
    return model


def local_expert_ids(model: MoENet) -> list[int]:
    """The global ids of the experts this rank holds: its place in its expert-parallel group × experts per rank."""
    from deepspeed.utils import groups

    moe = model.moe
    ep_rank = groups._get_expert_parallel_rank(moe.expert_group_name)
    return [ep_rank * moe.num_local_experts + i for i in range(moe.num_local_experts)]


def held_numel(model: nn.Module) -> tuple[int, int]:
    """(expert parameters, other parameters) this rank holds, told apart by DeepSpeed's own mark
    (``deepspeed.moe.utils.is_moe_param``: ``allreduce = False``, set by ``Experts``)."""
    from deepspeed.moe.utils import is_moe_param

    experts = sum(p.numel() for p in model.parameters() if is_moe_param(p))
    return experts, sum(p.numel() for p in model.parameters()) - experts


def group_ranks(model: MoENet) -> tuple[list[int], list[int]]:
    """Ranks of this rank's expert-parallel and expert-data-parallel groups, as DeepSpeed built them."""
    from deepspeed.utils import groups

    name = model.moe.expert_group_name
    return (list(groups._get_expert_parallel_group_ranks(name)),
            list(groups._get_expert_data_parallel_group_ranks(name)))


_TEACHER = None


def batch(step: int, rank: int, micro: int = MICRO):
    """Rank ``rank``'s inputs (micro × SEQ tokens of IN features) and labels for ``step``: labels from a fixed
    random teacher, so there is something to learn."""
    global _TEACHER
    if _TEACHER is None:
        _TEACHER = torch.randn(IN, CLASSES, generator=torch.Generator().manual_seed(7))
    g = torch.Generator().manual_seed(10_000 * step + rank)
    x = torch.randn(micro, SEQ, IN, generator=g)
    return x, (x @ _TEACHER).argmax(-1)


def train_step(engine, step: int, aux_coef: float = 0.01,
               windows: dict | None = None) -> tuple[float, torch.Tensor, float]:
    """One step on this rank's share: (loss averaged over the ranks, expert counts summed over the ranks, l_aux).
    ``windows``: a dict that receives DeepSpeed's comms logger windows (``course_utils.rank.comms.logged``) of the
    forward (``"forward"``) and of the backward and optimizer step (``"backward"``)."""
    import contextlib

    import torch.distributed as dist

    from course_utils.rank import comms

    window = comms.logged if windows is not None else contextlib.nullcontext
    x, y = batch(step, dist.get_rank())
    with window() as forward:
        logits, l_aux, counts = engine(x.to(engine.device))
    loss = F.cross_entropy(logits.reshape(-1, CLASSES), y.reshape(-1).to(engine.device))
    with window() as backward:
        engine.backward(loss + aux_coef * l_aux)
        engine.step()
    if windows is not None:
        windows.update(forward=forward, backward=backward)
    mean, total = loss.detach().clone(), counts.detach().clone().float()
    dist.all_reduce(mean)
    dist.all_reduce(total)
    return mean.item() / dist.get_world_size(), total, l_aux.detach().item()


SETTINGS = ("lr", "weight_decay", "betas", "eps")


def optimizer_groups(engine) -> list[dict]:
    """The param groups of the torch optimizer under the engine: name, moe flag, elements (this rank's partition,
    under ZeRO-1/2) and AdamW's settings."""
    opt = engine.optimizer
    inner = getattr(opt, "optimizer", opt)
    return [{"name": g.get("name", ""), "moe": bool(g.get("moe", False)),
             "numel": sum(p.numel() for p in g["params"]),
             **{k: list(g[k]) if k == "betas" else g.get(k) for k in SETTINGS if k in g}} for g in inner.param_groups]


def given_groups(optimizer) -> list[dict]:
    """The param groups of a torch optimizer as it was built, before ``deepspeed.initialize`` (ZeRO then replaces the
    parameters by flat partitions): per group its name and moe flag, the expert and other parameters in it (told apart
    by ``is_moe_param``), the expert groups its experts belong to, and its settings."""
    from deepspeed.moe.utils import is_moe_param

    out = []
    for g in optimizer.param_groups:
        experts = [p for p in g["params"] if is_moe_param(p)]
        out.append({"name": g.get("name", ""), "moe": bool(g.get("moe", False)),
                    "expert_numel": sum(p.numel() for p in experts),
                    "other_numel": sum(p.numel() for p in g["params"] if not is_moe_param(p)),
                    "expert_groups": sorted({p.group_name for p in experts}),
                    **{k: list(g[k]) if k == "betas" else g.get(k) for k in SETTINGS if k in g}})
    return out


def routing(k: int, capacity_factor: float, tokens: int, experts: int = 4, min_capacity: int = 4) -> dict:
    """One forward of a lone MoE layer (``ep_size`` 1, on this rank only, no engine) on ``tokens`` tokens: the
    capacity the gate used, its expert counts and auxiliary loss, and how many tokens came out all zeros."""
    from deepspeed.moe.layer import MoE

    torch.manual_seed(SEED)
    layer = MoE(hidden_size=HIDDEN, expert=expert(), num_experts=experts, ep_size=1, k=k,
                capacity_factor=capacity_factor, min_capacity=min_capacity)
    x = torch.randn(tokens, HIDDEN, generator=torch.Generator().manual_seed(3))
    captured = capacity_of(layer)
    with torch.no_grad():
        out, l_aux, counts = layer(x)
    return {"capacity": captured["C"], "counts": counts.tolist(),
            "dropped_tokens": int((out.abs().sum(-1) == 0).sum()), "l_aux": l_aux.item()}


def capacity_of(layer) -> dict:
    """A dict that holds, after each forward of the MoE layer ``layer``, the capacity C its gate used (``"C"``)."""
    captured = {}

    def keep(module, inputs, output):          # the gate returns (l_aux, C, E, ...): C is what dispatch sized by
        captured["C"] = int(output[1])

    layer.deepspeed_moe.gate.register_forward_hook(keep)
    return captured


# ---------------------------------------------------------------- transformers MoE models under ZeRO-3

FAMILIES = {"OLMoE": "olmoe", "Mixtral": "mixtral"}
VOCAB, TOKENS = 128, 32
FIRST_ID = 3                       # ids 0-2 are the pad, bos and eos tokens: the sequences use the other 125
LIST_TOKENS = 4                    # the expert-list model's batch: 1 sequence of 4 random ids, 8 routes over 8 experts


def tiny_moe_lm(family: str):
    """A tiny causal LM of a transformers MoE family, built from its config (random weights, no download):
    2 layers of width 32, 8 experts of which each token uses 2."""
    import transformers

    sizes = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=64, num_experts_per_tok=2, pad_token_id=0,
                 bos_token_id=1, eos_token_id=2)
    if family == "OLMoE":
        config = transformers.OlmoeConfig(num_experts=8, **sizes)
        cls = transformers.OlmoeForCausalLM
    else:
        config = transformers.MixtralConfig(num_local_experts=8, **sizes)
        cls = transformers.MixtralForCausalLM
    torch.manual_seed(SEED)
    return cls(config)


def sparse_block(model) -> type:
    """The class of the model's sparse MoE block (the module that holds the router and the experts)."""
    return type(model.model.layers[0].mlp)


def lm_batch(step: int, rank: int, micro: int = 2, tokens: int = TOKENS):
    """Rank ``rank``'s token ids for ``step``: ``micro`` sequences that count up by one from a random start (after
    the last id comes ``FIRST_ID`` again), so each token says what the next one is: a rule the tiny models learn in a
    few steps. On random ids no model could do better than guessing among the 125 ids, a loss of ln 125."""
    g = torch.Generator().manual_seed(20_000 * step + rank)
    start = torch.randint(0, VOCAB - FIRST_ID, (micro, 1), generator=g)
    return FIRST_ID + (start + torch.arange(tokens)) % (VOCAB - FIRST_ID)


def random_ids(step: int, rank: int, micro: int = 1, tokens: int = LIST_TOKENS):
    """Rank ``rank``'s ids for ``step`` for the expert-list model: random ids, new every step. There is no rule in
    them to learn: what its runs compare is ZeRO-3's losses with plain PyTorch's, step by step."""
    g = torch.Generator().manual_seed(20_000 * step + rank)
    return torch.randint(FIRST_ID, VOCAB, (micro, tokens), generator=g)


class FetchCounter:
    """Counts ZeRO-3's parameter fetches (``PartitionedParameterCoordinator.fetch_sub_module`` calls: one per
    module whose parameters are gathered before it runs, in forward and in backward) while it is entered."""

    def __enter__(self):
        from deepspeed.runtime.zero.partitioned_param_coordinator import PartitionedParameterCoordinator as C

        self.count, self._original = 0, C.fetch_sub_module

        def counted(coordinator, module, forward):
            self.count += 1
            return self._original(coordinator, module, forward)

        C.fetch_sub_module = counted
        return self

    def __exit__(self, *exc):
        from deepspeed.runtime.zero.partitioned_param_coordinator import PartitionedParameterCoordinator as C

        C.fetch_sub_module = self._original


class ExpertListBlock(nn.Module):
    """A sparse MoE block written the way transformers 4.x wrote Mixtral's: a router and a ``ModuleList`` of
    expert MLPs, and a forward that runs only the experts some token of *this rank's* batch was routed to."""

    def __init__(self, hidden: int = 32, ffn: int = 48, experts: int = 8, top_k: int = 2):
        super().__init__()
        self.top_k = top_k
        self.gate = nn.Linear(hidden, experts, bias=False)
        self.experts = nn.ModuleList(expert(hidden, ffn) for _ in range(experts))

    def forward(self, hidden_states):
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, shape[-1])
        weights, chosen = torch.topk(F.softmax(self.gate(x), dim=-1), self.top_k, dim=-1)
        out = torch.zeros_like(x)
        for e in chosen.unique().tolist():            # the experts this rank's tokens chose, and only those
            token, slot = torch.where(chosen == e)
            out.index_add_(0, token, self.experts[e](x[token]) * weights[token, slot, None])
        return out.reshape(shape)


def with_expert_lists(model):
    """``model`` (a tiny transformers MoE LM) with each layer's sparse block replaced by an :class:`ExpertListBlock`."""
    cfg = model.config
    torch.manual_seed(SEED)
    for layer in model.model.layers:
        layer.mlp = ExpertListBlock(cfg.hidden_size, cfg.intermediate_size, 8, cfg.num_experts_per_tok)
    return model
