/**
 * A run's metric curves as the panel keeps them: per metric, one line per
 * rank and one for the mean over ranks, each downsampled as rows arrive
 * (min/max-preserving, see `m4.ts`). Memory and drawing cost stay bounded
 * however long the run; the whole history stays in the kernel, which answers
 * a zoomed chart's window at full resolution.
 */
import { IPoints, M4Line, MAX_POINTS } from './m4';
import type { IMetricRow } from './protocol';

/** One line's drawn points: steps and values. */
export interface ISeries {
  readonly steps: number[];
  readonly values: number[];
}

/**
 * Steps whose mean waits for more ranks are kept up to this many; past it the
 * oldest are taken with the ranks they have (a rank that never logs a metric).
 */
export const MAX_OPEN_STEPS = 4096;

/** Means over ranks of one metric, handed out once a step is settled. */
class StepMeans {
  add(step: number, value: number): void {
    const at = this._open.get(step);
    if (at) {
      at.sum += value;
      at.count += 1;
    } else {
      this._open.set(step, { sum: value, count: 1 });
    }
  }

  /**
   * The steps settled now, in step order: every rank logged there, or every
   * rank moved past it (`passed`: the lowest step any rank last logged).
   */
  settle(worldSize: number, passed: number | null, final: boolean): [number, number][] {
    const ready: number[] = [];
    const waiting: number[] = [];
    for (const [step, at] of this._open) {
      const done = final || at.count >= worldSize || (passed !== null && step < passed);
      (done ? ready : waiting).push(step);
    }
    const overflow = waiting.length - MAX_OPEN_STEPS;
    if (overflow > 0) {
      ready.push(...waiting.sort((a, b) => a - b).slice(0, overflow));
    }
    ready.sort((a, b) => a - b);
    return ready.map(step => {
      const at = this._open.get(step)!;
      this._open.delete(step);
      return [step, at.sum / at.count];
    });
  }

  private _open = new Map<number, { sum: number; count: number }>();
}

function series(points: IPoints): ISeries {
  return { steps: points.xs, values: points.ys };
}

export class MetricHistory {
  /**
   * `worldSize`: ranks in the run (null: as many as have logged);
   * `maxPoints`: the most points a line keeps.
   */
  constructor(
    public worldSize: number | null = null,
    readonly maxPoints: number = MAX_POINTS
  ) {}

  /** Add rows; returns how many were new (duplicates are skipped). */
  add(rows: readonly IMetricRow[]): number {
    let added = 0;
    const touched = new Set<string>();
    for (const row of rows) {
      if (this._seen(row)) {
        continue;
      }
      for (const [name, value] of Object.entries(row.metrics)) {
        this._line(name, row.rank).add(row.step, value);
        this._meanOf(name).add(row.step, value);
        touched.add(name);
      }
      added += 1;
    }
    for (const name of touched) {
      this._settle(name, false);
    }
    this._rows += added;
    return added;
  }

  /** The run is over: take the means of the steps still waiting for a rank. */
  finish(): void {
    for (const name of this._means.keys()) {
      this._settle(name, true);
    }
  }

  /** Rows taken in; grows only, so views use it to tell whether to redraw. */
  get rowCount(): number {
    return this._rows;
  }

  /** Metric names in the order they first appeared. */
  get metricNames(): string[] {
    return [...this._lines.keys()];
  }

  /** Per-rank drawn points of one metric (empty when the metric is unknown). */
  series(metric: string): ReadonlyMap<number, ISeries> {
    const out = new Map<number, ISeries>();
    for (const [rank, line] of this._lines.get(metric) ?? []) {
      out.set(rank, series(line.points()));
    }
    return out;
  }

  /** The drawn points of the mean over ranks (null before a step settled). */
  mean(metric: string): ISeries | null {
    const line = this._meanLines.get(metric);
    return line && line.count > 0 ? series(line.points()) : null;
  }

  /** The most points any one line of `metric` holds (what a chart draws per line). */
  maxLinePoints(metric: string): number {
    let most = this._meanLines.get(metric)?.points().xs.length ?? 0;
    for (const line of this._lines.get(metric)?.values() ?? []) {
      most = Math.max(most, line.points().xs.length);
    }
    return most;
  }

  /** The first and last step of any line of `metric` ([0, 0] when empty). */
  stepRange(metric: string): [number, number] {
    let lo = Infinity;
    let hi = -Infinity;
    for (const line of this._lines.get(metric)?.values() ?? []) {
      const { xs } = line.points();
      if (xs.length) {
        lo = Math.min(lo, xs[0]);
        hi = Math.max(hi, xs[xs.length - 1]);
      }
    }
    return lo <= hi ? [lo, hi] : [0, 0];
  }

  private _line(name: string, rank: number): M4Line {
    let byRank = this._lines.get(name);
    if (!byRank) {
      byRank = new Map();
      this._lines.set(name, byRank);
    }
    let line = byRank.get(rank);
    if (!line) {
      line = new M4Line(this.maxPoints);
      byRank.set(rank, line);
    }
    return line;
  }

  private _meanOf(name: string): StepMeans {
    let means = this._means.get(name);
    if (!means) {
      means = new StepMeans();
      this._means.set(name, means);
      this._meanLines.set(name, new M4Line(this.maxPoints));
    }
    return means;
  }

  private _settle(name: string, final: boolean): void {
    const worldSize = this.worldSize ?? this._last.size;
    let passed: number | null = null;
    if (this._last.size >= worldSize) {
      passed = Math.min(...[...this._last.values()].map(l => l.step));
    }
    const line = this._meanLines.get(name)!;
    for (const [step, mean] of this._means.get(name)!.settle(worldSize, passed, final)) {
      line.add(step, mean);
    }
  }

  /**
   * A rank's rows arrive in order. A panel that attaches mid-run gets the
   * history and may then see a few of the same rows live; anything not after
   * the last row of that rank is such a repeat.
   */
  private _seen(row: IMetricRow): boolean {
    const last = this._last.get(row.rank);
    if (last && (row.t < last.t || (row.t === last.t && row.step === last.step))) {
      return true;
    }
    this._last.set(row.rank, { t: row.t, step: row.step });
    return false;
  }

  private _lines = new Map<string, Map<number, M4Line>>();
  private _means = new Map<string, StepMeans>();
  private _meanLines = new Map<string, M4Line>();
  private _last = new Map<number, { t: number; step: number }>();
  private _rows = 0;
}
