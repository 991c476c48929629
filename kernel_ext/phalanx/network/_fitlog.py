"""The record of one ``fit``: what each machine did, why, where and for how long.

Example::

    >>> log = FitLog(actions={"pca": "fit", "tree": "skip"}, reasons={"pca": "forced",
    ...              "tree": "up to date"}, times={"pca": 0.25, "tree": 0.0})
    >>> log.ran
    ['pca']
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields


@dataclass
class FitLog:
    """Per machine: ``actions`` (``"fit"``, ``"update"`` or ``"skip"``), ``reasons``,
    ``times`` (fit wall time in seconds, 0 for skips), ``spans`` (start and end timestamps,
    ``time.time()`` where the fit ran), ``workers`` (where it ran); ``failed`` maps machines whose
    fit raised to the exception; ``cancelled`` lists machines not fitted because something
    upstream failed."""

    actions: dict[str, str] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    times: dict[str, float] = field(default_factory=dict)
    spans: dict[str, tuple[float, float]] = field(default_factory=dict)
    workers: dict[str, str] = field(default_factory=dict)
    failed: dict[str, BaseException] = field(default_factory=dict)
    cancelled: list[str] = field(default_factory=list)
    backend: str = "serial"
    wall_s: float = 0.0

    @property
    def ran(self) -> list[str]:
        """Machines that were fitted or updated successfully."""
        return [n for n, a in self.actions.items()
                if a != "skip" and n not in self.failed and n not in self.cancelled]

    def merge(self, other: FitLog) -> FitLog:
        """This log with ``other``'s entries added where this one only skipped."""
        out = FitLog()
        for f in fields(self):   # dicts are copied, so merging never changes this log
            value = getattr(self, f.name)
            setattr(out, f.name, dict(value) if isinstance(value, dict) else value)
        out.cancelled = [*self.cancelled, *other.cancelled]
        for name, action in other.actions.items():
            if out.actions.get(name, "skip") == "skip":
                out.actions[name] = action
                out.reasons[name] = other.reasons.get(name, "")
                out.times[name] = other.times.get(name, 0.0)
                if name in other.spans:
                    out.spans[name] = other.spans[name]
                if name in other.workers:
                    out.workers[name] = other.workers[name]
        out.failed.update(other.failed)
        out.wall_s = self.wall_s + other.wall_s
        return out

    def __repr__(self) -> str:
        rows = [f"FitLog({self.backend}, {self.wall_s:.3f} s)"]
        width = max((len(n) for n in self.actions), default=0)
        for name, action in self.actions.items():
            status = action
            if name in self.failed:
                status = f"{action} FAILED ({type(self.failed[name]).__name__})"
            elif name in self.cancelled:
                status = f"{action} cancelled"
            secs = self.times.get(name, 0.0)
            reason = self.reasons.get(name, "")
            rows.append(f"  {name:<{width}}  {status:<8} {secs:8.3f} s  {reason}")
        return "\n".join(rows)
