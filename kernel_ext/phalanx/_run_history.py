"""The session's questions about the current (or last) run's metric history.

What a reloaded panel draws (every metric downsampled, with the mean over ranks) and what a
zoomed chart asks for (a step or time window at full resolution), as plain rows in the events'
wire form.  A mixin of :class:`~phalanx._session.Session`: it reads only the session's fit
runner.

Example: ``session.run_history_window(steps=(1000, 1200), rank=0)``
"""

from __future__ import annotations

from typing import Any

from .fit import FitRunner


class RunHistoryQueries:
    """Read-only queries on the running run's history, else the last run's."""

    fits: FitRunner

    def run_history_rows(self) -> list[dict]:
        """Metric rows of the current (or last) run, in the events' wire form, downsampled to a
        few thousand points per line (min/max-preserving): what a reloaded panel draws."""
        digest = self._run_digest()
        return digest.wire_rows() if digest is not None else []

    def _run_digest(self) -> Any:
        tracker = self.fits.active
        if tracker is not None:
            return tracker.digest
        if self.fits.last is None:
            return None
        self.fits.last.curves()  # builds the digest of a record that has none
        return self.fits.last.digest

    def _run_history(self) -> Any:
        tracker = self.fits.active
        record = self.fits.last
        return tracker.history if tracker is not None else (record.history if record else None)

    def run_history_means(self) -> dict[str, list]:
        """The mean over ranks of each metric of the current (or last) run, downsampled like
        :meth:`run_history_rows`: ``{metric: [[step, mean], ...]}``."""
        digest = self._run_digest()
        return digest.mean_points() if digest is not None else {}

    def run_history_window_means(self, steps: tuple[float, float],
                                 max_points: int | None = None) -> dict[str, list]:
        """The mean over ranks of each metric inside a step window, at full resolution up to
        ``max_points`` (a zoomed chart): ``{metric: [[step, mean], ...]}``."""
        from .fit.telemetry._digest import MEAN, window_points

        history = self._run_history()
        if history is None:
            return {}
        out = {}
        for name in history.metric_names():
            xs, ys = window_points(history, name, MEAN, *steps, max_points=max_points)
            out[name] = [[int(x), y] for x, y in zip(xs.tolist(), ys.tolist())]
        return out

    def run_history_window(self, steps: tuple | None = None, times: tuple | None = None,
                           rank: int | None = None, max_points: int | None = None) -> list[dict]:
        """Rows of the current (or last) run inside a step or time window, at full resolution
        up to ``max_points`` per line (a zoomed chart), in the events' wire form.

        Example: ``session.run_history_window(steps=(1000, 1200), rank=0)``
        """
        from .fit.telemetry._digest import window_rows

        history = self._run_history()
        if history is None:
            return []
        return window_rows(history, steps, times, rank, max_points)
