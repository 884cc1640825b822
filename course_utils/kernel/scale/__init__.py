"""Real scale: what a CPU run measures exactly (bytes moved, FLOPs, bytes held) carried to real model sizes and named
GPUs, as *projections*.

- :mod:`.specs` — the GPUs, links and drives of ``hardware.toml``, each figure with its published source;
- :mod:`.models` — real models (GPT-2 XL, a Llama-3-8B shape, a Mixtral-8x7B shape, T5-3B) built from their configs on
  PyTorch's ``meta`` device: exact parameter counts, nothing downloaded, no memory used;
- :mod:`.counts` — the count formulas (FLOPs of a step, bytes each collective or transfer moves), each one first checked
  against what a run of the course measured at toy size (:func:`.counts.agreement`);
- :mod:`.project` — a step-time model: counts ÷ rates, with the assumptions (MFU, link efficiency, overlap) said;
- :mod:`.machine` — this machine's own figures, measured by a launched rank, so that the same model can first project
  the toy runs of this machine and be compared with what they measured.

Counts are measured; times on GPUs are projected, and every table that shows one says so.
"""
