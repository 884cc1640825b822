"""Loaded by every process of a course launch (the runner puts this folder on PYTHONPATH).

In a rank (the process DeepSpeed's launcher started, not its children) it records when and where the
rank dies of an uncaught exception, so the runner can name the rank that failed first rather than a peer
that only lost its connection to it afterwards; and it ends a rank whose script returned without the
interpreter's teardown, which can abort in gloo (see :func:`_end_rank_without_teardown`). A rank that
died only because a peer went away exits :data:`PEER_LOST_WAIT` seconds late, so that DeepSpeed's launcher
reports the peer's exit status, the cause, and not this rank's. In the ranks and in DeepSpeed's runner and
launcher, the garbage collector keeps out of torch's import (:func:`_collect_garbage_once_torch_is_imported`);
the functions at the end adjust a few library modules as they are imported.
"""
import atexit
import json
import os
import re
import sys
import time

from course_utils.common import devices, run_folder

# The rank itself: launched with RANK set, and the first process of the launch to load this hook with it
# (a rank's own children, a DataLoader worker or a compile worker, inherit COURSE_RANK_PID and are not ranks).
_IS_RANK = ("RANK" in os.environ and run_folder.ENV in os.environ
            and os.environ.get("COURSE_RANK_PID", str(os.getpid())) == str(os.getpid()))
if _IS_RANK:
    os.environ["COURSE_RANK_PID"] = str(os.getpid())

_previous_hook = sys.excepthook
_state = {"failed": False, "exit_status": None, "peer_lost": False}
# A rank whose error only says that a peer went away (gloo's "Connection reset by peer" once the peer died)
# lingers this long before it exits. DeepSpeed's launcher (deepspeed/launcher/launch.py) looks at its ranks once
# a second and reports the first one it finds ended; without the wait, when the peer's death and this error land
# in the same second, it may report this rank's exit status (1) instead of the one that failed first.
PEER_LOST = re.compile(r"Connection (reset|closed) by peer|Broken pipe")
PEER_LOST_WAIT = 2.0


def _flush_standard_streams():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def _record_failure(exc_type, exc, tb):
    when = time.time()
    _state["failed"] = True
    _previous_hook(exc_type, exc, tb)      # the traceback first: once every rank has a record, the runner ends the launch
    if not _IS_RANK:
        return
    _flush_standard_streams()
    run_folder.write_failure(os.environ["RANK"], when, exc)
    # the wait comes at exit, not here: torch.distributed's own excepthook (the "[rank0]:" prefix) holds this one's
    # output back until it returns, and a rank the launcher ends while it waits would take its traceback along
    _state["peer_lost"] = bool(PEER_LOST.search(str(exc)))


sys.excepthook = _record_failure


def _end_rank_without_teardown():
    """A rank whose script returned (or called ``sys.exit``) ends here, without the interpreter's teardown.

    Registered first, this ``atexit`` handler runs after every other one. Tearing down what DeepSpeed and
    torch.distributed still hold (engines, process groups) can abort in gloo's threads ("terminate called
    without an active exception", exit -6) after the script's work is done, and fail a launch that succeeded;
    the course's own scripts avoid it with ``scaffolding.finish()``, a learner's script need not know. So:
    flush every open file (teardown would have), then end the rank as ``scaffolding.finish()`` does
    (:func:`course_utils.common.run_folder.end_rank`), with the script's status. A rank that died of an exception takes
    the normal path.
    """
    if _state["failed"]:
        if _state["peer_lost"]:
            _flush_standard_streams()
            time.sleep(PEER_LOST_WAIT)    # the launcher ends this rank sooner, once it has seen the peer's status
        return
    status = _state["exit_status"]
    code = 0 if status is None else status if isinstance(status, int) else 1
    from course_utils.common.ending import flush_open_files
    flush_open_files()
    run_folder.end_rank(code)


def _exit_remembering_status(status=None, _exit=sys.exit):
    import threading
    if threading.current_thread() is threading.main_thread():     # sys.exit in a thread ends only the thread
        _state["exit_status"] = status
    _exit(status)


def _register_stack_dump():
    """Let the runner ask this rank where it is: on SIGUSR1, Python's ``faulthandler`` writes every thread's
    stack to ``stacks/rank<N>-<pid>.txt`` in the run folder (no privileges needed, unlike attaching a debugger).
    The runner sends it when a launch times out, before it kills the ranks, so a hang names the line each rank
    was waiting on (``launch.stacks.rank_stacks``)."""
    import faulthandler
    import signal
    try:
        name = str(run_folder.stacks_file(run_folder.current(), os.environ["RANK"], os.getpid()))
        os.makedirs(os.path.dirname(name), exist_ok=True)
        stream = open(name + ".tmp", "w")
        faulthandler.register(signal.SIGUSR1, file=stream, all_threads=True)
        os.replace(name + ".tmp", name)        # the runner signals only ranks whose file exists: registered by then
        _state["stack_file"] = stream          # faulthandler writes to its descriptor: keep it open
    except (OSError, ValueError, AttributeError):
        pass


if _IS_RANK:
    sys.exit = _exit_remembering_status
    atexit.register(_end_rank_without_teardown)
    _register_stack_dump()


def _remember_cpu_info():
    """Ask py-cpuinfo once per machine instead of twice per op load in every rank.

    DeepSpeed's op builders call ``cpuinfo.get_cpu_info()`` twice each time a rank JIT-loads an op
    (``cpu_arch`` and ``simd_width``, deepspeed/ops/op_builder/builder.py), and every call starts a
    Python subprocess that busy-waits about a second to measure the clock: ~2.4 s of CPU per rank for
    each engine with CPU Adam. The answer is the same every time on one machine, so it is kept next to
    the ops built for this machine (``$TORCH_EXTENSIONS_DIR``) and returned unchanged.
    """
    try:
        import cpuinfo
    except ImportError:
        return
    import platform
    ask = cpuinfo.get_cpu_info
    folder = os.environ.get("TORCH_EXTENSIONS_DIR")
    path = os.path.join(folder, f"cpuinfo-{platform.node()}-{platform.machine()}.json") if folder else None
    memo = {}

    def get_cpu_info():
        if "info" not in memo:
            try:
                with open(path) as f:
                    memo["info"] = json.load(f)
            except (TypeError, OSError, ValueError):
                memo["info"] = ask()
                if path:
                    try:
                        os.makedirs(folder, exist_ok=True)
                        tmp = f"{path}.{os.getpid()}"
                        with open(tmp, "w") as f:
                            json.dump(memo["info"], f)
                        os.replace(tmp, path)
                    except OSError:
                        pass
        return dict(memo["info"])

    cpuinfo.get_cpu_info = get_cpu_info


_remember_cpu_info()


_PATCHES = {}   # module name -> function applied to the module right after it is first imported


class _PatchAfterImport:
    """Meta-path finder that runs ``_PATCHES[name](module)`` once ``name`` has been imported (its own loader
    executes it first), for the few library modules the rank hook adjusts."""

    def find_spec(self, name, path, target=None):
        if name not in _PATCHES:
            return None
        import importlib.machinery
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or not hasattr(spec.loader, "exec_module"):
            return spec
        execute, patch = spec.loader.exec_module, _PATCHES[name]

        def exec_module(module):
            execute(module)
            patch(module)
        spec.loader.exec_module = exec_module
        return spec

    def invalidate_caches(self):
        pass


def _compile_muon_kernels_when_first_called():
    """Let DeepSpeed wrap its Muon kernels in ``torch.compile`` when they first run, not when a ZeRO engine starts.

    Every ZeRO engine checks its optimizer with ``is_zero_supported_optimizer``
    (deepspeed/runtime/zero/utils.py), which imports ``deepspeed.runtime.zero.muon.original_muon`` to add
    Muon to the supported list. That module decorates three kernels with ``@compiler.compile()``, i.e.
    ``torch.compile(fn)``, and creating those wrappers imports TorchDynamo and Inductor: about 3 s of CPU in
    every rank of every ZeRO launch, for an optimizer the course never uses. ``torch.compile`` compiles a
    function on its first call anyway, so applying it on the first call instead of at import changes nothing
    but when the wrapper is made. ``deepspeed.runtime.compiler.compile`` is patched the moment DeepSpeed
    imports that module (the three Muon kernels are its only users in deepspeed 0.19.8).
    """
    import functools

    def patch(module):
        make_decorator = module.compile

        def compile():
            decorator = make_decorator()

            def lazily(fn):
                compiled = []

                @functools.wraps(fn)
                def call(*args, **kwargs):
                    if not compiled:
                        compiled.append(decorator(fn))
                    return compiled[0](*args, **kwargs)
                return call
            return lazily
        module.compile = compile

    _PATCHES["deepspeed.runtime.compiler"] = patch


def _trainer_joins_the_cpu_ranks():
    """On CPU-only ranks, ``TrainingArguments(deepspeed=...)`` joins the launch's process group as on GPUs.

    On GPUs the Trainer's arguments build accelerate's DeepSpeed state by themselves. On CPU-only ranks
    accelerate looks for an accelerator, finds none, and every rank counts itself alone: the Trainer computes
    ``train_batch_size`` for one rank and DeepSpeed, which sees them all, rejects it. A learner's own Trainer
    script would need two extra lines here that it does not need on GPUs, so in a rank of a CPU launch with
    several ranks the hook adds them: before ``TrainingArguments.__post_init__`` with a ``deepspeed`` config
    it builds accelerate's ``PartialState`` for DeepSpeed over gloo and sets
    ``accelerator_config["use_configured_state"]`` (``course_utils.rank.trainer.prepare_cpu_state``, what the
    course's own scripts call through ``training_arguments``), and rank 0 says so once in its log.
    ``COURSE_HOOK_TRAINER=0`` in the launch's environment leaves the Trainer as it is (notebook 08 shows why).
    """
    if not (_IS_RANK and int(os.environ.get("WORLD_SIZE", "1")) > 1 and os.environ.get("COURSE_HOOK_TRAINER", "1") != "0"):
        return

    def patch(module):
        cls = module.TrainingArguments
        post_init = cls.__post_init__

        def __post_init__(self):
            if self.deepspeed and devices.is_cpu_rank():
                from course_utils.rank.trainer import prepare_cpu_state, with_configured_state
                prepare_cpu_state()
                self.accelerator_config = with_configured_state(self.accelerator_config)
                if os.environ.get("RANK") == "0" and not _state.get("told_trainer"):
                    _state["told_trainer"] = True
                    print("[course rank hook] TrainingArguments(deepspeed=...) on CPU-only ranks: accelerate's DeepSpeed "
                          "state prepared over gloo first (GPUs need nothing; elsewhere see notebook 08, section 8)",
                          file=sys.stderr, flush=True)
            post_init(self)
        cls.__post_init__ = __post_init__

    _PATCHES["transformers.training_args"] = patch


def _cpu_ranks_see_no_gpu():
    """A CPU rank sees no GPU, also on a GPU machine.

    The course makes a launch's ranks CPU ranks with ``DS_ACCELERATOR=cpu`` and an empty ``CUDA_VISIBLE_DEVICES``,
    but DeepSpeed's launcher then sets ``CUDA_VISIBLE_DEVICES`` for every rank it starts, whatever its accelerator
    (``deepspeed/launcher/launch.py``: ``--num_gpus 2`` → ``0,1``). Left so, torch in a CPU rank sees the GPU, and
    whatever asks ``torch.cuda.is_available()`` (accelerate, the Trainer) takes the GPU path in a rank whose
    DeepSpeed runs on the CPU. Hidden again here, before the script imports torch
    (:func:`course_utils.common.devices.is_cpu_rank` decides; without ``DS_ACCELERATOR`` nothing is asked here).
    """
    if _IS_RANK and os.environ.get(devices.ACCELERATOR_ENV) and devices.is_cpu_rank():
        os.environ["CUDA_VISIBLE_DEVICES"] = ""


def _cuda_as_the_described_machine():
    """In a rank of a described GPU machine (``COURSE_SIMULATED_GPUS``: the tests run a GPU machine's decisions
    without a GPU), ``torch.cuda.is_available()`` and ``device_count()`` answer as that machine's CUDA would, from
    ``CUDA_VISIBLE_DEVICES`` (:func:`course_utils.common.devices.visible_gpus`); the rank computes on the CPU."""
    gpus = os.environ.get(devices.SIMULATED_GPUS_ENV)
    if not gpus:
        return

    def patch(module):
        def device_count():
            return devices.visible_gpus(int(gpus), os.environ.get("CUDA_VISIBLE_DEVICES"))
        module.device_count = device_count
        module.is_available = lambda: device_count() > 0

    _PATCHES["torch.cuda"] = patch


def _keep_the_configs_rank0_reads():
    """Rank 0 writes each distinct DeepSpeed config it reads to ``configs/<n>.json`` in the run folder, as
    ``DeepSpeedConfig`` parsed it (deepspeed/runtime/config.py: a dict, a path or base64, read with hjson), with the
    batch sizes and ZeRO stage DeepSpeed resolved from it: the config the ranks really used, whichever helper or the
    Trainer (its "auto" values filled) built it. ``deepspeed.initialize`` and ``zero.Init`` both make one; a config
    DeepSpeed refuses is written too, before its error."""
    if not (_IS_RANK and os.environ.get("RANK") == "0"):
        return
    seen = []

    def keep(cfg, error=None):
        try:
            text = json.dumps(cfg._param_dict, indent=2, default=str)
        except (AttributeError, TypeError, ValueError):
            return
        if text in seen:
            return
        seen.append(text)
        if error is None:
            resolved = {k: getattr(cfg, a, None) for k, a in (
                ("train_batch_size", "train_batch_size"), ("micro_batch", "train_micro_batch_size_per_gpu"),
                ("accumulation", "gradient_accumulation_steps"), ("world_size", "world_size"),
                ("zero_stage", "zero_optimization_stage"))}
            resolved["bf16"] = bool(getattr(getattr(cfg, "bfloat16_config", None), "enabled", False))
            resolved["fp16"] = bool(getattr(getattr(cfg, "float16_config", None), "enabled", False))
            entry = {"resolved": resolved}
        else:
            entry = {"refused": f"{type(error).__name__}: {error}"[:500]}
        try:
            folder = os.path.join(str(run_folder.current()), run_folder.CONFIGS)
            os.makedirs(folder, exist_ok=True)
            path = os.path.join(folder, f"{len(seen)}.json")
            with open(path + ".tmp", "w") as f:
                json.dump({"config": json.loads(text), **entry}, f, indent=1, default=str)
            os.replace(path + ".tmp", path)
        except (OSError, TypeError, ValueError):
            pass

    def patch(module):
        cls = module.DeepSpeedConfig
        init = cls.__init__

        def __init__(self, *args, **kwargs):
            try:
                init(self, *args, **kwargs)
            except Exception as e:
                keep(self, e)
                raise
            keep(self)
        cls.__init__ = __init__

    _PATCHES["deepspeed.runtime.config"] = patch


def _collect_garbage_once_torch_is_imported():
    """In the processes every launch starts (DeepSpeed's runner, its launcher, the ranks), Python's cyclic garbage
    collector waits until torch is imported, then keeps out of what the import made.

    Each of these processes imports torch first thing (the runner and the launcher through ``import deepspeed``): a
    couple of hundred thousand objects that live as long as the process. The collector walks them again and again,
    while they are made and at every full collection after (DeepSpeed calls ``gc.collect()`` when it builds and frees
    engines). So here it is off during torch's import; then one collection frees what the import left as garbage,
    ``gc.freeze()`` moves the rest out of the collector's sight (Python's docs describe it for this), and the
    collector runs as before for everything else. ``import deepspeed`` costs about 0.4 s less CPU per process this
    way (of 2.2 s here), four processes per 2-rank launch, the first two one after the other. A process that is not
    one of these (a tool a rank starts) is left as it is; the scripts of notebooks 12 and 15 freeze again after their
    own imports.
    """
    import gc
    argv = getattr(sys, "orig_argv", [])
    runner = len(argv) > 1 and os.path.basename(argv[1]) == "deepspeed"
    launcher = "-m" in argv[1:4] and "deepspeed.launcher.launch" in argv[1:4]
    if not (_IS_RANK or runner or launcher) or not gc.isenabled() or "torch" in sys.modules:
        return
    gc.disable()

    def patch(module):
        gc.collect()
        gc.freeze()
        gc.enable()

    _PATCHES["torch"] = patch


_collect_garbage_once_torch_is_imported()
_compile_muon_kernels_when_first_called()
_keep_the_configs_rank0_reads()
_trainer_joins_the_cpu_ranks()
_cpu_ranks_see_no_gpu()
_cuda_as_the_described_machine()
sys.meta_path.insert(0, _PatchAfterImport())
