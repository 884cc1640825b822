"""Translate under ZeRO-3 in your own loop, without the Trainer: ``engine.module.generate`` on every rank.

The trained model (``save_model``'s folder from the ZeRO-2 run) is loaded with plain ``from_pretrained`` and wrapped
by ``deepspeed.initialize`` with a ZeRO-3 config: its parameters are partitioned, and every forward pass gathers each
layer's weights from every rank. Rank 0 translates the shortest test sentences, the other ranks the longest, so rank
0's translations end first.

It translates twice:
1. ``generate(..., synced_gpus=True)``: every rank runs forward passes until all ranks are done;
2. ``generate(...)`` as transformers decides by itself. Without the Trainer's integration no ZeRO-3 config is
   registered in the process, so ``synced_gpus`` comes out False: rank 0 stops after its own sentences and goes on
   to the barrier at the end, while the others still gather parameters for their next token. It hangs.
   ``--synced_second`` passes ``synced_gpus=True`` there too (the fix: the script then finishes).

Each rank records how many forward passes of the model each ``generate`` made and how long its translations are.

Run from a terminal (it hangs: stop it with Ctrl-C):
  deepspeed --num_gpus 2 scripts/10_generate_zero3.py --model build/10_translation/zero2/model \
      --tokenizer build/data/translation_4000_120_0_<language>/tokenizer --sources <a JSON list of sentences> \
      --deepspeed_config <a ZeRO-3 config>
"""
import argparse
import json
from pathlib import Path

import torch
import torch.distributed as dist
# transformers first: its import is the slow, silent part of a rank's start, and the launch cell's stall= counts
# silence only once every rank has printed (importing deepspeed prints its first line)
from transformers import PreTrainedTokenizerFast, T5ForConditionalGeneration
from transformers.integrations import HfDeepSpeedConfig, is_deepspeed_zero3_enabled

import deepspeed

from course_utils.common.record import record
from course_utils.common.records.translation import GenerateRun
from course_utils.rank.scaffolding import finish, load_config, parse_args


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="a model folder (save_model's) to translate with")
    parser.add_argument("--tokenizer", default=None, help="the tokenizer's folder (translation.prepare's tokenizer/)")
    parser.add_argument("--sources", default=None, help="a JSON file: the list of sentences to choose from")
    parser.add_argument("--sentences", type=int, default=2, help="test sentences per rank")
    parser.add_argument("--max_length", type=int, default=24)
    parser.add_argument("--synced_second", action="store_true", help="pass synced_gpus=True to the second generate too")
    return parser


def sentences_for(rank: int, world_size: int, sources: list[str], n: int) -> list[str]:
    """Rank 0: the ``n`` shortest sentences (in words); every other rank: the ``n`` longest, so that rank 0's
    translations end first."""
    by_length = sorted(sources, key=lambda s: (len(s.split()), s))
    return by_length[:n] if rank == 0 else by_length[-n:]


class ForwardCounter:
    """Counts the calls of a module's forward (a forward pre-hook): ``generate`` calls the model once per token."""

    def __init__(self, module: torch.nn.Module):
        self.calls = 0
        module.register_forward_pre_hook(self._count)

    def _count(self, module, inputs):
        self.calls += 1


def main(argv=None) -> None:
    args = parse_args(build_parser(), argv)
    config = load_config(args)
    deepspeed.init_distributed()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    tokenizer = PreTrainedTokenizerFast.from_pretrained(args.tokenizer)
    model = T5ForConditionalGeneration.from_pretrained(args.model)      # plain transformers: no ZeRO-3 config registered
    # what generate's default reads (transformers/integrations/deepspeed.py): without the Trainer, nothing registered;
    # an HfDeepSpeedConfig object (what TrainingArguments(deepspeed=...) keeps) registers the config while it lives
    registered = {"plain from_pretrained": is_deepspeed_zero3_enabled()}
    kept = HfDeepSpeedConfig(config)
    registered["while an HfDeepSpeedConfig lives"] = is_deepspeed_zero3_enabled()
    del kept
    registered["after it is gone"] = is_deepspeed_zero3_enabled()
    engine, *_ = deepspeed.initialize(model=model, config=config)
    engine.module.eval()
    partitioned = all(hasattr(p, "ds_tensor") and p.numel() == 0 for p in engine.module.parameters())
    counter = ForwardCounter(engine.module)

    sources = sentences_for(rank, world_size, json.loads(Path(args.sources).read_text()), args.sentences)
    batch = tokenizer(sources, return_tensors="pt", padding=True).to(engine.device)

    def translate(round_: int, synced_gpus: bool | None) -> None:
        counter.calls = 0
        print(f"round {round_}: generate(synced_gpus={synced_gpus}) on {len(sources)} sentences", flush=True)
        with torch.no_grad():
            out = engine.module.generate(**batch, max_length=args.max_length, do_sample=False, num_beams=1,
                                         synced_gpus=synced_gpus)
        lengths = [int((row != tokenizer.pad_token_id).sum()) for row in out]     # tokens generated, </s> included
        print(f"round {round_}: done after {counter.calls} forward passes; translation lengths {lengths}", flush=True)
        record(GenerateRun(round=round_, synced_gpus=synced_gpus, forward_calls=counter.calls, lengths=lengths,
                           sentences=sources, translations=tokenizer.batch_decode(out, skip_special_tokens=True),
                           registered=registered, partitioned=partitioned, world_size=world_size))

    translate(1, True)
    translate(2, True if args.synced_second else None)
    print("translations done: waiting for every rank at a barrier", flush=True)
    dist.barrier()
    finish()


if __name__ == "__main__":
    main()
