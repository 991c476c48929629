"""What an engine runs for one ``%%distributed_fit`` cell.

The kernel calls :func:`run_cell` on every engine with that rank's :class:`~phalanx.wire._seam.RunSpec`, its
own shard and, when the engine lacks some, the shipped names it needs (cached here by content
hash, so an unchanged object is never sent twice; :func:`stash_objects`).  ``run_cell`` never
raises: it returns a :class:`~phalanx.wire._seam.RankResult` saying what happened, so the kernel can tell a
failing rank from a dead one and report each precisely.
"""

from __future__ import annotations

import contextlib
import linecache
import logging
import os
import socket
import sys
import time
import traceback
from dataclasses import replace
from typing import Any

from ..sync._agreement import check_run_agreement
from ..sync._zero_change import finish_uneven
from ._interrupts import InterruptGate
from ..debug._post_mortem import forget_failure, keep_failure
from ..commits._resume import StopForResize, make_checkpointer
from ._fit_mode import mode_for
from ._kept_objects import keep, put_kept
from ._returns import released_by_a_stop, returned, returned_so_far
from ._run_children import end_children_since
from ...wire._seam import CELL_FILENAME, Outcome, RankResult, RunSpec
from ..debug._stacks import install_stacks_handler
from ._engine_state import RunContext, engine_state
from ._run_namespace import as_main, build_namespace
from ._faults import fault_of
from ._threads import share_cores
from ..adapters.torchrun import torchrun_world
from ._unreturned import unreturned_names

log = logging.getLogger("phalanx")


def stash_objects(blobs: dict[str, tuple[str, bytes]], keep: list[str]) -> int:
    """Store pickled shipped objects by name (bytes, not objects: each run unpickles afresh, so
    a model trained on the engine never leaks into the next run of the cell)."""
    cache = engine_state().cache
    for name in [n for n in cache if n not in keep]:
        cache.pop(name)
    cache.update(blobs)
    return len(cache)


def cached_hashes() -> dict[str, str]:
    """Content hashes of what this engine holds (lets the kernel skip re-sending)."""
    return {name: h for name, (h, _) in engine_state().cache.items()}


def run_cell(spec: RunSpec,
             stash: tuple[dict[str, tuple[str, bytes]], list[str]] | None = None) -> RankResult:
    """Run the cell body as rank ``spec.rank``; returns how it ended. ``stash`` is what to store
    first (:func:`stash_objects`' arguments), before an interrupt can act: the kernel counts it
    as held from now on, whatever the run does.

    The kernel's interrupt is raised only while the run can act on it (see ``_interrupts``):
    one arriving once this rank is on its way back is dropped, so the result always gets back."""
    if stash is not None:
        stash_objects(*stash)
    forget_failure()  # the last failure's frames (%debug) hold its objects: they go now
    _shielded(install_stacks_handler)  # %cluster stacks answers while the run is busy
    gate = InterruptGate()
    gate.install_open()
    try:
        return _run_cell(spec, gate)
    except KeyboardInterrupt:  # landed in the instant between the run's end and the gate closing
        return RankResult(Outcome.INTERRUPTED, error="KeyboardInterrupt",
                          message="interrupted while returning")
    finally:
        gate.close()
        # Once the run's frame is gone: its locals (the shipped classes, whose methods hold the
        # cell's globals) kept everything the cell built reachable until then
        _shielded(engine_state().garbage.after_run)


def _run_cell(spec: RunSpec, gate: InterruptGate) -> RankResult:
    started = time.time()
    state = engine_state()
    run = None
    profiler = None
    namespace = None
    main = sent = None
    shipped: dict[str, Any] = {}  # the notebook's names as sent, before the cell rebinds them
    # The run's module is the process's __main__ from here until its result is packed
    # (--return included: skorch's __getstate__ pickles the module's class by name)
    main_module = contextlib.ExitStack()
    try:
        main, sent = build_namespace(spec)
        namespace = main.__dict__
        shipped = {name: namespace[name] for name in spec.names if name in namespace}
        main_module.enter_context(as_main(main))
        put_kept(state, spec.kept, namespace)  # live objects of earlier runs (--keep)
        group = _ensure_group(state, spec)
        share_cores(group.spec.hosts, spec.rank)
        run = _new_run(spec, group, namespace)
        run.namespace = namespace
        run.interrupts = gate
        run.checkpoints = make_checkpointer(spec.checkpoint, spec.rank, spec.world_size)
        state.run = run
        _seed(spec.train.seed, spec.rank)
        namespace.update(rank=spec.rank, world_size=spec.world_size, device=run.device)
        _install_hooks(run, namespace, spec.train.shard)
        code = _compile(spec.body)
        profiler = _start_profiler(spec.train.profile, run.device)
        with torchrun_world(spec, group):
            exec(code, namespace)
        finish_uneven(run)  # ranks that still train get answers until every rank is done
        for strategy, params_fn in run.tracked:
            strategy.finish(params_fn())
        check_run_agreement(run, "at the end of the run")
        unreturned = unreturned_names(run, spec, shipped, namespace) if spec.rank == 0 else ()
        gate.close()  # no collective is left: an interrupt now could only lose the result
        _cleanup(run)
        kept = keep(state, spec.train.keep, namespace)
        return RankResult(Outcome.OK, kept=kept, steps=run.progress, wall_s=time.time() - started,
                          returns=returned(spec, namespace, sent),
                          held=mode_for(namespace, spec.train.mode).held_bytes(namespace),
                          profile=profiler.result() if profiler is not None else None,
                          trained_not_returned=unreturned, **_progress(run))
    except StopForResize as stop:  # every rank stops at the same commit: nothing to release
        gate.close()
        return RankResult(Outcome.RESIZED, error="StopForResize", message=str(stop),
                          steps=run.progress if run else 0, wall_s=time.time() - started,
                          **_progress(run))
    except BaseException as exc:  # KeyboardInterrupt too: the kernel asked us to stop
        gate.close()  # this rank reports now; a later interrupt must not replace its error
        # Describe the failure before cleaning up: an interrupt arriving during the cleanup must
        # not replace the error that caused it.
        outcome = Outcome.INTERRUPTED if isinstance(exc, KeyboardInterrupt) else Outcome.RAISED
        failure = RankResult(outcome, error=type(exc).__name__, fault=fault_of(exc),
                             message=str(exc),
                             traceback=_format_traceback(exc), steps=run.progress if run else 0,
                             host=socket.gethostname(), pid=os.getpid(),
                             # the ranks a collective error blames (missing, dead): names a
                             # stalled peer
                             ranks=tuple(int(r) for r in getattr(exc, "ranks", None) or ()),
                             memory=_memory_now(), **_progress(run))
        failure = replace(failure, debuggable=_frames_held_for_debug(spec, exc))
        _shielded(_poison_group, state, exc)
        _shielded(end_children_since, started)  # nothing will wait for what the cell started
        if namespace is not None and (outcome is Outcome.INTERRUPTED or released_by_a_stop(exc)):
            # Stop or an interrupt: --return brings back what was trained so far, as a plain
            # loop interrupted in the notebook keeps its model (the kernel uses it only when
            # the run ended interrupted)
            failure = replace(failure, returns=returned_so_far(spec, namespace, sent))
        return replace(failure, wall_s=time.time() - started)
    finally:
        _shielded(main_module.close)
        if profiler is not None:
            _shielded(profiler.stop)
        _shielded(_cleanup, run)
        if run is not None and run.metrics is not None:
            _shielded(run.metrics.close)
        state.run = None
        # Each run has a namespace of its own: once the result is packed, nothing of the cell
        # is needed here.  A cell's functions and torch's optimizers hold reference cycles, so
        # what it built would stay in memory (into the next run, doubling its peak) until
        # Python's cycle collector ran: drop our references (run_cell collects where it matters).
        if run is not None:
            run.namespace, run.tracked, run.strategies, run.grad_sync = {}, [], {}, None
            run.watch = None
        run = profiler = namespace = main = sent = None
        shipped = {}  # its notebook classes hold the cell's globals


def _progress(run: RunContext | None) -> dict[str, Any]:
    """When this rank stopped (for release-time figures) and its last committed step."""
    checkpoints = run.checkpoints if run is not None else None
    return dict(ended_at=time.time(),
                last_commit=checkpoints.last_commit if checkpoints is not None else None,
                steps_loop=checkpoints.used if checkpoints is not None else None)


def _memory_now() -> dict | None:
    """This rank's memory when it failed (names an out-of-memory error with figures)."""
    try:
        from ..telemetry._memory import memory_sample

        return memory_sample()
    except Exception:
        return None


def _frames_held_for_debug(spec: RunSpec, exc: BaseException) -> bool:
    """Keep the failure's frames for ``%debug``; a failure to keep them never hides the
    run's own error."""
    try:
        return keep_failure(spec.run_id, spec.rank, exc)
    except Exception as error:
        log.warning("phalanx: keeping the failure's frames for %%debug failed: %r", error)
        return False


def _shielded(fn: Any, *args: Any) -> None:
    """Run a cleanup step to the end even if the kernel's interrupt arrives meanwhile; a
    cleanup that still fails is logged, never raised (the run's own result must get back)."""
    for _attempt in range(2):
        try:
            fn(*args)
            return
        except KeyboardInterrupt:
            continue
        except Exception as exc:
            log.warning("phalanx: cleanup step %s failed: %r", getattr(fn, "__name__", fn), exc)
            return


def _ensure_group(state: Any, spec: RunSpec) -> Any:
    from ._group import ensure_group

    state.group = ensure_group(state.group, spec.group)
    return state.group


def _shard_rows(namespace: dict, spec: RunSpec) -> int | None:
    """Rows of this rank's ``--shard`` data (for the uneven-inputs message), if any."""
    for name in spec.train.shard:
        value = namespace.get(name)
        if value is not None and hasattr(value, "__len__"):
            return len(value)
    return None


def _new_run(spec: RunSpec, group: Any, namespace: dict) -> RunContext:
    from ..sync._collectives import Collectives
    from ..sync._join import JoinControl
    from ..telemetry._metrics import MetricsSender

    # A notebook-defined strategy arrives as a shipped name: this run's copy of the class.
    train = spec.train
    strategy = namespace[train.sync] if spec.sync_from_notebook else train.sync
    run = RunContext(run_id=spec.run_id, rank=spec.rank, world_size=spec.world_size,
                     device=_device(spec), strategy_spec=strategy, train=train, spec=spec)
    run.collectives = Collectives(group)
    run.bytes_at_start = run.collectives.bytes_sent
    run.join = JoinControl(run.collectives, train.uneven, _shard_rows(namespace, spec))
    from ..telemetry._memory import reset_cuda_peak

    reset_cuda_peak()  # the run's peak, not the process's
    run.metrics = MetricsSender(spec.metrics_address, spec.run_id, spec.rank,
                                spec.metrics_token, spec.memory_interval_s, spec.metrics_keys)
    run.collectives.clock = run.metrics.clock
    # The step's parts cost a few clock reads per step; PHALANX_STEP_PARTS=0 turns them off.
    run.metrics.clock.parts_enabled = os.environ.get("PHALANX_STEP_PARTS", "1") != "0"
    return run


def _device(spec: RunSpec) -> Any:
    import torch

    if spec.group.backend == "nccl" or (os.environ.get("CUDA_VISIBLE_DEVICES")
                                              and torch.cuda.is_available()):
        from ._own_gpu import use_own_gpu

        return use_own_gpu(spec)  # cuda:LOCAL_RANK, now the current device (see _device_rule)
    return torch.device("cpu")


def _seed(seed: int | None, rank: int) -> None:
    if seed is None:
        return
    import random

    import numpy as np
    import torch

    random.seed(seed + rank)
    np.random.seed((seed + rank) % 2**32)
    torch.manual_seed(seed + rank)


def _install_hooks(run: RunContext, namespace: dict, shard: tuple[str, ...]) -> None:
    from ..debug._breakpoints import install_breakpoints
    from ..sync._zero_change import StepHooks, attach_existing_optimizers
    from ..sync._sharded import release_derived_classes
    from ..adapters import install_adapters

    # Every change below is written in run.patches, which _cleanup takes back, last first
    hooks = StepHooks(run)
    run.patches.on_undo(hooks.remove, "phalanx's optimizer and gradient hooks")
    hooks.install()
    attach_existing_optimizers(hooks, namespace)
    install_adapters(run, namespace, shard)  # other libraries' and frameworks' (adapters/)
    run.patches.on_undo(release_derived_classes, "torch's derived FSDP classes")
    install_breakpoints(run)  # breakpoint() pauses this rank, typed from the notebook


def _start_profiler(steps: int | None, device: Any) -> Any:
    from ..telemetry._profile import start_profiler

    return start_profiler(steps, device)


def _cleanup(run: RunContext | None) -> None:
    """Take back what the run changed in other libraries (its hooks too: all in
    ``run.patches``).  An undo that failed is said in the cell: the engine may act differently
    until restarted."""
    if run is None:
        return
    for failure in run.patches.undo_all():
        print(f"phalanx: rank {run.rank}: {failure}; if this engine misbehaves: "
              f"%cluster restart {run.rank}", file=sys.stderr, flush=True)


def _compile(body: str) -> Any:
    # Registering the source lets tracebacks show the user's lines; the blank first line stands
    # for the %%distributed_fit line, so a frame's line number is the one the editor shows.
    source = "\n" + body
    linecache.cache[CELL_FILENAME] = (len(source), None, source.splitlines(True), CELL_FILENAME)
    if _last_compiled[0] != source:  # a re-run of the same cell: its code object, not compiled again
        # dont_inherit: the cell's code does not take this module's __future__ imports (its
        # annotations stay evaluated, as in the notebook)
        _last_compiled[:] = [source, compile(source, CELL_FILENAME, "exec", dont_inherit=True)]
    return _last_compiled[1]


_last_compiled: list = [None, None]  # [source, code] of the last cell run on this engine


def _poison_group(state: Any, exc: BaseException) -> None:
    """Tear the group down so peers blocked in a collective with us are released now."""
    if state.group is not None:
        try:
            if state.run is not None and state.run.collectives is not None:
                state.run.collectives.abort(f"rank {state.run.rank} failed: {exc!r}")
        finally:
            state.group.close()
            state.group = None


def _format_traceback(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    user = [i for i, f in enumerate(frames) if f.filename == CELL_FILENAME]
    start = user[0] if user else 0  # hide phalanx's own frames above the user's code
    lines = traceback.format_list(frames[start:])
    lines += traceback.format_exception_only(type(exc), exc)
    return "".join(lines)
