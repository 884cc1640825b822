"""Inside the ranks: what the launched ranks (scripts/*.py) import, besides :mod:`course_utils.common`.

- :mod:`.scaffolding` — a script's command line, config, exercise file, seeds, rank-0 printing, clean exit;
- :mod:`.distributed` — rank identity, device and backend, every collective, byte counter, all_reduce timing;
- :mod:`.engine` — DeepSpeed engines: experiment configs, one step, dtypes, freeing, the offload ladder;
- :mod:`.memory` — what an engine holds (tensor inventory), where it lives, the process's RSS;
- :mod:`.models` — tiny models from configs, GPT-2 presets named by purpose;
- :mod:`.data` — generated data sets, tokenizers and the deterministic data streams;
- :mod:`.optimizers` — DeepSpeed optimizer and scheduler config sections;
- :mod:`.trainer` — the Hugging Face Trainer on CPU and GPU ranks, HF × DS combinations, "auto" fills;
- :mod:`.translation` — the capstone's synthetic language pair, tiny T5, BLEU, translation;
- :file:`hook/sitecustomize.py` — loaded by every rank's interpreter (the launch puts ``hook/`` on its path).

Nothing here imports the notebook kernel's side (the runner, config checks, exercise checks, tables, plots,
pandas, matplotlib, ipywidgets); tests/test_boundary.py enforces it.
"""
from course_utils.common import paths as _paths

# DeepSpeed's JIT-built ops (cpu_adam, async_io, shm comm) are cached per environment, in
# <venv>/torch_extensions/<cpu or cuda>, where `make setup` built them. A launch passes the notebook's environment on
# to the ranks, but a script started from a terminal imports only this package, so it sets the default too.
_paths.use_course_torch_extensions()
