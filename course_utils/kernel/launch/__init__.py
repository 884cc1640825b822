"""The course's runner of multi-rank launches (the real ``deepspeed`` launcher) and single tools.

Notebooks call :func:`deepspeed` and :func:`command` (or a view's function marked :func:`launches`, which makes
one :func:`deepspeed` launch and says with how many ranks); the package splits the work into modules of one
job each, so each can be read (and tested) on its own:

- :mod:`.runner`: the launch itself, start to result (``deepspeed(...)`` → ``run(script, args, options)``);
- :mod:`.options`: :class:`LaunchOptions`, the settings of one launch;
- :mod:`.commands`: script, run folder, config argument and the ``deepspeed`` command lines;
- :mod:`.environment`: the ranks' environment;
- :mod:`.streams`: the live ``[rank N]`` stream and the filter of what a learner sees;
- :mod:`.processes`: process groups, the watchdog, /dev/shm buffers;
- :mod:`.stacks`: the ranks' Python stacks, for a launch that hangs or fails;
- :mod:`.failures`: which rank failed first, and the messages;
- :mod:`.result`: :class:`LaunchResult` and the errors;
- :mod:`.tool`: :func:`command`, one single-process tool;
- :mod:`.sshd`: loopback "hosts" served by an sshd of the course's own, for DeepSpeed's multi-node path;
  :mod:`.sshd_setup`: its programs, keys and files;
- :mod:`.slurm`: a 2-node Slurm cluster of the course's own (munged, slurmctld, two slurmd, files under build/);
  :mod:`.slurm_setup`: its programs, key and config; :mod:`.slurm_launch`: DeepSpeed launched under it three ways,
  and the batch script a participant submits.
"""
from __future__ import annotations

from course_utils.common import paths  # noqa: F401  (launch.paths: where the tests and notebooks find run folders)
from course_utils.kernel.launch.commands import free_port
from course_utils.kernel.launch.options import DEFAULT_TIMEOUT, LaunchOptions, launches
from course_utils.kernel.launch.processes import release_shm_buffers
from course_utils.kernel.launch.result import CommandError, LaunchError, LaunchResult
from course_utils.kernel.launch.runner import deepspeed, run
from course_utils.kernel.launch.tool import command

__all__ = ["deepspeed", "run", "command", "LaunchError", "LaunchResult", "LaunchOptions", "CommandError",
           "free_port", "release_shm_buffers", "DEFAULT_TIMEOUT", "launches"]
