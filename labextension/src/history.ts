/**
 * A run's metric curves as the panel keeps them: per metric, one line per
 * rank and one for the mean over ranks, each downsampled as points arrive
 * (min/max-preserving, see `m4.ts`). Memory and drawing cost stay bounded
 * however long the run; the whole history stays in the kernel, which answers
 * a zoomed chart's window at full resolution. The mean comes from the kernel,
 * which takes it from every row: the rows a panel gets may be thinned.
 */
import { IPoints, M4Line, MAX_POINTS } from './m4';
import type { IMetricRow, MeanPoints } from './protocol';

/** One line's drawn points: steps and values. */
export interface ISeries {
  readonly steps: number[];
  readonly values: number[];
}

function series(points: IPoints): ISeries {
  return { steps: points.xs, values: points.ys };
}

export class MetricHistory {
  /** `maxPoints`: the most points a line keeps. */
  constructor(readonly maxPoints: number = MAX_POINTS) {}

  /** Add rows; returns how many were new (duplicates are skipped). */
  add(rows: readonly IMetricRow[]): number {
    let added = 0;
    for (const row of rows) {
      if (this._seen(row)) {
        continue;
      }
      for (const [name, value] of Object.entries(row.metrics)) {
        this._line(name, row.rank).add(row.step, value);
      }
      added += 1;
    }
    this._rows += added;
    return added;
  }

  /**
   * Add points of the mean lines, in step order per metric; returns how many
   * were new (a step already drawn, sent again after a reload, is skipped).
   */
  addMeans(means: MeanPoints | undefined): number {
    let added = 0;
    for (const [name, points] of Object.entries(means ?? {})) {
      let line = this._meanLines.get(name);
      if (!line) {
        line = new M4Line(this.maxPoints);
        this._meanLines.set(name, line);
      }
      let last = this._lastMeanStep.get(name) ?? -Infinity;
      for (const [step, mean] of points) {
        if (step > last) {
          line.add(step, mean);
          last = step;
          added += 1;
        }
      }
      this._lastMeanStep.set(name, last);
    }
    this._rows += added;
    return added;
  }

  /** Rows and mean points taken in; grows only, so views use it to tell whether to redraw. */
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
  private _meanLines = new Map<string, M4Line>();
  private _lastMeanStep = new Map<string, number>();
  private _last = new Map<number, { t: number; step: number }>();
  private _rows = 0;
}
