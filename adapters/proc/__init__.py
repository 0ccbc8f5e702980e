"""Process supervision: launching managed servers, watching them, ending them.

Split along the launch's file protocol; import from the module that defines
a name (this package re-exports nothing):

- ``plan``: :class:`LaunchPlan` (argv, environment, cwd) and ``launch_env``;
  ``limits``: the rlimits and ``run_as`` trampoline.
- ``records``: the launch and exit records shared with ``shim.py`` (the
  exit-status shim, standard-library only, run by path).
- ``spawn``: starting the shim and its handshake; ``handles``: the two process
  handles (``ManagedProcess``, ``AttachedProcess``) and the ``ServerProcess``
  protocol; ``waiter``: what they share (exit report, output tails);
  ``output``: log files and tails; ``recovery``: boot recovery of a launch.
- ``identity``, ``pidfd``, ``pgroup``, ``descendants``, ``tree``: recognising a
  process, signalling it exactly, its process group, the descendants that
  leave it, and the whole tree as the node ends it.
- ``cgroups``, ``containment``, ``mounts``: containment in cgroup v2, v1 or
  process groups.
- ``system``: the operating-system seam (:class:`~.system.System`, the real
  one) and ``fake``: the in-memory one beside it; ``table``: one read of the
  process table; ``errors``: the errors raised here.

It imports nothing from the rest of ``adapters``. See
``docs/process-supervision.md``.
"""
