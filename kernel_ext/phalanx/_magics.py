"""``%cluster`` and ``%%distributed_fit``: parse arguments, call the session, show the result.

The magics hold no logic of their own; every verb is a :class:`~phalanx._session.Session`
method that works the same from Python.  The session answers with plain data; what is shown
(the engine table, the run's views) comes from :mod:`phalanx.widgets`.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Callable

from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.core.magic import Magics, line_cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from ._debug_magic import register_debug
from ._session import session_for_shell
from ._usage import parse_line, unknown_word
from .cluster import ClusterError, GpuSpecError, LaunchOptions
from .fit import FitOptions, FitUsageError, ShippingError
from .fit.run._errors import DistributedFitError, VersionSkewError
from .fit.analysis._shipping import UndefinedNameError, notebook_names
from .fit.analysis._suggest import did_you_mean, joined
from .wire import _options as T  # every training flag's default and choices

if TYPE_CHECKING:
    from ._background import BackgroundRun, OnStart
    from ._session import EngineStatus, Session
    from .fit import RunRecord
    from .fit.telemetry._tracker import RunTracker
    from .network import FitLog
    from .widgets._cluster_table import ClusterStatus
    from .widgets._status_line import StatusLine

CLUSTER_ACTIONS = ("start", "scale", "stop", "status", "restart", "forget", "stacks")

# Errors that mean "this request cannot be done as asked": shown as one clear line (IPython
# shows a UsageError without a traceback; phalanx's frames would only bury the message).
_USER_ERRORS = (ClusterError, GpuSpecError, FitUsageError, ShippingError, VersionSkewError,
                UndefinedNameError)


def _display(obj: object, metadata: dict | None = None) -> None:
    from IPython.display import display

    display(obj, metadata=metadata) if metadata else display(obj)


def _table(status: EngineStatus) -> ClusterStatus:
    """The engine table of ``status`` (an :class:`~phalanx._session.EngineStatus`)."""
    from .widgets._cluster_table import ClusterStatus  # UI at the edge: loaded when shown

    return ClusterStatus.of(status)


@magics_class
class PhalanxMagics(Magics):
    """The phalanx magics, bound to this kernel's session."""

    @property
    def ipython(self) -> InteractiveShell:
        """The shell these magics are registered on (``Magics`` types it as optional)."""
        assert self.shell is not None, "the magics run on the shell that registered them"
        return self.shell

    @property
    def session(self) -> Session:
        return session_for_shell(self.ipython)

    @magic_arguments()
    @argument("action", nargs="?", default=None,
              help="start | scale N | stop | status | restart [RANK] | forget [NAMES] | "
                   "stacks; none shows the cluster")
    @argument("value", nargs="?", default=None,
              help="engine count for scale, rank for restart, names for forget (a,b)")
    @argument("-n", type=int, default=None, help="engines to start (default: one per GPU, else 2)")
    @argument("--gpus", default="auto", help="auto | none | comma list of device indices")
    @argument("--launcher", default="local", help="local | mpi | ssh | slurm | pbs | lsf")
    @argument("--profile", default=None, help="ipyparallel profile (name or folder) holding launcher configuration")
    @argument("--timeout", type=float, default=60.0, help="seconds to wait for engines")
    @argument("--ip", default=None, help="address the controller listens on (default: the "
              "interface that routes to the engines; loopback for local engines)")
    @argument("--hosts", default=None, help="ssh: HOST:N[,HOST:N...] engines per host")
    @argument("--slurm-args", "--pbs-args", "--lsf-args", dest="submit_args", default=None,
              help='batch launchers: extra submit flags, e.g. --slurm-args="--partition=gpu"')
    @argument("--no-encryption", action="store_true",
              help="no CurveZMQ encryption off loopback (trusted networks only)")
    @line_magic
    def cluster(self, line: str) -> None:
        """Start, scale, restart, stop and show the engine cluster."""
        args = parse_line(self.cluster, line, "%cluster")
        action = args.action
        if action is not None and action not in CLUSTER_ACTIONS:
            raise UsageError(unknown_word("%cluster action", action, CLUSTER_ACTIONS)
                             + " (%cluster? shows every flag)")
        if action in ("start", "stop", "status", "stacks") and args.value is not None:
            raise UsageError(f"%cluster {action} takes no {args.value!r}"
                             + (f": the engine count is a flag, %cluster start -n {args.value}"
                                if action == "start" else ""))
        try:
            self._cluster_action(action, args)
        except _USER_ERRORS as exc:
            raise UsageError(str(exc)) from None

    def _cluster_action(self, action: str | None, args: argparse.Namespace) -> None:
        session = self.session
        if action is None:
            from .widgets import cluster_view  # UI at the edge: loaded when shown

            _display(cluster_view(session))
        elif action == "status":
            _display(_table(session.status()))
            kept = session.fits.kept_description()
            if kept:
                print(f"kept on the engines (--keep): {kept}; %cluster forget NAMES releases them")
            tasks = session.dask_tasks()
            if tasks:
                print(f"dask: {tasks} task(s) running on the engines (learning networks, "
                      "phalanx.dask_client())")
        elif action == "stacks":
            print(session.stacks())
        elif action == "forget":
            names = None if args.value is None else [n.strip() for n in args.value.split(",")]
            gone = session.forget(names)
            print(f"released: {', '.join(gone)}" if gone else "nothing is kept on the engines"
                  + ("" if names is None else f" under {', '.join(names)}"))
        elif action == "start":
            if session.running:
                print(f"a cluster is already running with {session.size} engine(s); "
                      "use %cluster scale N to resize it or %cluster stop first")
                _display(_table(session.status()))
                return
            options = LaunchOptions(ip=args.ip, hosts=args.hosts, submit_args=args.submit_args,
                                    encrypt=not args.no_encryption, profile=args.profile)
            self._changing_engines("%cluster start", lambda: session.start_cluster(
                n=args.n, gpus=args.gpus, launcher=args.launcher, profile=args.profile,
                timeout=args.timeout, options=options))
        elif action == "scale":
            n = _whole_number(args.value, "%cluster scale N")
            self._changing_engines(f"%cluster scale {n}", lambda: session.scale(n))
        elif action == "restart":
            rank = None if args.value is None else _whole_number(args.value, "%cluster restart RANK", 0)
            _display(_table(session.restart(rank)))
        elif action == "stop":
            print("cluster stopped" if session.stop_cluster() else "no cluster is running")
            if session.cluster.still_exiting:  # a host that could not be reached
                print("these engine processes could not be checked or ended; they exit by "
                      "themselves without the controller: " + "; ".join(session.cluster.still_exiting))

    def _changing_engines(self, what: str, change: Callable[[], EngineStatus]) -> None:
        """Run ``change`` (a start or scale) under a line saying how it goes, then show the
        engine table in the line's place."""
        from .widgets._cluster_progress import follow_change, show_result

        line = _first_line(self.ipython, True, f"{what}: …")
        follow_change(line, what, self.session.engines_starting)
        try:
            table = _table(change())
        except BaseException:  # the error is the cell's output
            if line is not None:
                line.clear()
            raise
        show_result(line, table, _display)

    @magic_arguments()
    @argument("target", nargs="?", default=None, help="(line form) a learning-network node to fit")
    @argument("-n", type=int, default=None, help="ranks to run on (default: every engine)")
    @argument("--sync", default=T.DEFAULT_SYNC,
              help=" | ".join(T.STRATEGIES) + " | NotebookClass | pkg.mod.Class")
    @argument("--every", type=int, default=T.DEFAULT_EVERY, help="K: steps between synchronisations")
    @argument("--alpha", type=float, default=T.DEFAULT_ALPHA, help="EASGD moving rate")
    @argument("--backend", default="auto", help=" | ".join(T.BACKENDS))
    @argument("--shard", default=None, help="names split by rows across ranks, e.g. X,y")
    @argument("--return", dest="returns", default=None, help="names brought back from rank 0")
    @argument("--keep", default=None,
              help="names left live on the engines for the next cells (%%cluster forget "
                   "releases them)")
    @argument("--seed", type=int, default=None, help="seeds random/numpy/torch as S+rank")
    @argument("--steps", type=int, default=None, help="expected optimizer steps (for progress)")
    @argument("--timeout", type=float, default=None, help="stop the run after SEC seconds")
    @argument("--collective-timeout", type=float, default=60.0, help="deadline of one collective")
    @argument("--name", default=None, help="a name for the run")
    @argument("--no-widget", action="store_true", help="plain text progress instead of widgets")
    @argument("--checkpoint-every", type=int, default=None,
              help="K: commit model, optimizer, step and RNG states every K steps() iterations")
    @argument("--checkpoint-dir", default=None, help="also write each rank's commits to DIR")
    @argument("--resume", action="store_true", help="continue from the last commit")
    @argument("--max-restarts", type=int, default=0,
              help="R: restart a failing rank and resume, up to R times")
    @argument("--keep-history", default=None,
              help="DIR: keep the run's complete metric history there (default: removed with "
                   "the kernel's temporary data)")
    @argument("--tensorboard", default=None, metavar="DIR",
              help="write every rank's metrics, the options and the summary as TensorBoard "
                   "event files in DIR/<name>-<run id> while the run goes on")
    @argument("--mlflow", default=None, metavar="URI",
              help="the same as an MLflow run (experiment 'phalanx'); a path or file: URI is "
                   "MLflow's file store, no server needed")
    @argument("--uneven", default=T.DEFAULT_UNEVEN,
              help=" | ".join(T.UNEVEN) + ": ranks that run out of data early answer the others, "
                   "or fail")
    @argument("--profile", nargs="?", type=int, const=5, default=None, metavar="STEPS",
              help="record STEPS optimizer steps (default 5) on every rank with torch.profiler "
                   "into one trace file next to the notebook")
    @argument("--bucket-mb", type=float, default=T.DEFAULT_BUCKET_MB, metavar="MB",
              help="gradient bucket size: averaging of a full bucket starts while backward "
                   f"still runs (default {T.DEFAULT_BUCKET_MB:g}, as DDP's bucket_cap_mb)")
    @argument("--overlap", default=T.DEFAULT_OVERLAP,
              help=" | ".join(T.OVERLAP) + ": average full gradient buckets while backward "
                   "still runs (auto: where the ranks span several hosts)")
    @argument("--check-every", type=int, default=T.DEFAULT_CHECK_EVERY, metavar="K",
              help="check every K optimizer steps, and at the end, that the ranks hold one "
                   "model (0: only at the end)")
    @argument("--background", action="store_true",
              help="return at once with a run handle (run.wait(), run.stop(), run.status)")
    @line_cell_magic
    def distributed_fit(self, line: str, cell: str | None = None
                        ) -> BackgroundRun | FitLog | None:
        """Run the cell's training loop on every engine, data-parallel."""
        args = parse_line(self.distributed_fit, line, "%distributed_fit" if cell is None
                          else "%%distributed_fit")
        if cell is None:
            return self._fit_network(args)
        if args.target is not None:  # `--shard X, y`: the list ends at the space
            raise UsageError(f"%%distributed_fit does not take {args.target!r}: a flag takes one "
                             "value, with no spaces in a list (--shard X,y)")
        try:
            opts = FitOptions.build(n=args.n, sync=args.sync, every=args.every, alpha=args.alpha,
                                    backend=args.backend, shard=args.shard, returns=args.returns,
                                    keep=args.keep,
                                    seed=args.seed, steps=args.steps, timeout=args.timeout,
                                    collective_timeout=args.collective_timeout, name=args.name,
                                    widget=not args.no_widget,
                                    checkpoint_every=args.checkpoint_every,
                                    checkpoint_dir=args.checkpoint_dir, resume=args.resume,
                                    max_restarts=args.max_restarts, uneven=args.uneven,
                                    keep_history=args.keep_history, profile=args.profile,
                                    tensorboard=args.tensorboard, mlflow=args.mlflow,
                                    bucket_mb=args.bucket_mb, overlap=args.overlap,
                                    check_every=args.check_every)
            if args.background:
                from ._background import report_end, run_in_background

                return run_in_background(self.session, lambda started: self._fit(cell, opts, started),
                                         opts.train.returns, self.ipython.user_ns,
                                         lambda handle: report_end(self.ipython, handle))
            self._fit(cell, opts)
        except DistributedFitError as exc:
            if not (exc.status == "interrupted" and self.session.stop_reason) and exc.status != "quit":
                raise
            # Stopped on request (Stop run, q in a rank's debugger): said in the cell, but not
            # a failed cell, which would make Jupyter abort the next cell the person runs.
            print(f"phalanx: {exc.args[0]}", file=sys.stderr)
        except _USER_ERRORS as exc:
            raise UsageError(str(exc)) from None
        return None

    def _fit(self, cell: str, opts: FitOptions, started: OnStart | None = None) -> RunRecord:
        line = _first_line(self.ipython, opts.widget, FIT_FIRST_LINE)  # before any view loads
        from .widgets import RunDisplay  # bokeh and ipywidgets: loaded on the first run, not at %load_ext

        shown = RunDisplay(self.session, self.ipython, widget=opts.widget, body=cell, line=line)

        def on_start(tracker: RunTracker, name: str) -> None:
            shown.start(tracker, name)
            if started is not None:
                started(tracker, name)

        try:
            record = self.session.distributed_fit(cell, opts, self.ipython.user_ns, on_start=on_start)
        finally:  # a failed or interrupted run keeps its summary too
            shown.show_summary(shown.finish())  # metadata {"phalanx": {"manifest": ...}}
        if record.profile is not None:
            _display(record.profile)
        return record

    def _fit_network(self, args: argparse.Namespace) -> FitLog:
        if args.target is None:
            raise UsageError("%distributed_fit NODE fits a learning network on the cluster; "
                             "use %%distributed_fit (two %) for a training cell")
        user_ns = self.ipython.user_ns
        node = user_ns.get(args.target)
        if node is None or not hasattr(node, "fit"):
            raise UsageError(joined(f"{args.target!r} is not a learning-network node in the notebook",
                                    did_you_mean(args.target, notebook_names(user_ns))))
        try:
            return self.session.fit_network(node)
        except _USER_ERRORS as exc:
            raise UsageError(str(exc)) from None


FIT_FIRST_LINE = "starting: packing what the cell uses from the notebook for the engines…"


def _first_line(shell: InteractiveShell, widget: bool, text: str) -> StatusLine | None:
    """The cell's first line, shown at once where a Jupyter frontend draws it (a
    :class:`~phalanx.widgets._status_line.StatusLine`); None in a terminal or with
    ``--no-widget``, whose text progress is its own first line."""
    if not widget or type(shell).__name__ != "ZMQInteractiveShell":
        return None
    from .widgets._status_line import StatusLine  # IPython's display alone: nothing heavy

    return StatusLine.show(text)


def _whole_number(value: str | None, usage: str, minimum: int = 1) -> int:
    try:
        if value is None:
            raise TypeError(value)
        number = int(value)
    except (TypeError, ValueError):
        raise UsageError(f"{usage}: expected a whole number, got {value!r}") from None
    if number < minimum:
        raise UsageError(f"{usage}: must be at least {minimum}, got {number}")
    return number


def register(ipython: InteractiveShell) -> None:
    """Register the magics on ``ipython`` (``%load_ext phalanx``), and show the session's
    :class:`~phalanx._session.EngineStatus` answers as the engine table there, so
    ``session.status()`` at the end of a cell looks like ``%cluster status``."""
    ipython.register_magics(PhalanxMagics)
    register_debug(ipython)  # %debug after a failed run opens the failing rank's frames
    formatters = getattr(getattr(ipython, "display_formatter", None), "formatters", {})
    if "text/html" in formatters and "text/plain" in formatters:
        formatters["text/html"].for_type_by_name("phalanx._session", "EngineStatus",
                                                 lambda status: _table(status)._repr_html_())
        formatters["text/plain"].for_type_by_name(
            "phalanx._session", "EngineStatus", lambda status, printer, cycle: printer.text(repr(_table(status))))
