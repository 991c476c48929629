/**
 * The whole metric history of one run, kept per metric and per rank as
 * parallel arrays so charts read it without copying row objects.
 */
import type { IMetricRow } from './protocol';

/** One rank's values of one metric, in arrival order. */
export interface ISeries {
  readonly steps: number[];
  readonly values: number[];
}

export class MetricHistory {
  /** Add rows; returns how many were new (duplicates are skipped). */
  add(rows: readonly IMetricRow[]): number {
    let added = 0;
    for (const row of rows) {
      if (this._seen(row)) {
        continue;
      }
      for (const [name, value] of Object.entries(row.metrics)) {
        let byRank = this._series.get(name);
        if (!byRank) {
          byRank = new Map();
          this._series.set(name, byRank);
        }
        let series = byRank.get(row.rank);
        if (!series) {
          series = { steps: [], values: [] };
          byRank.set(row.rank, series);
        }
        series.steps.push(row.step);
        series.values.push(value);
      }
      added += 1;
    }
    this._rows += added;
    return added;
  }

  /** Rows held; grows only, so views use it to tell whether to redraw. */
  get rowCount(): number {
    return this._rows;
  }

  /** Metric names in the order they first appeared. */
  get metricNames(): string[] {
    return [...this._series.keys()];
  }

  /** Per-rank series of one metric (empty when the metric is unknown). */
  series(metric: string): ReadonlyMap<number, ISeries> {
    return this._series.get(metric) ?? new Map();
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

  private _series = new Map<string, Map<number, ISeries>>();
  private _last = new Map<number, { t: number; step: number }>();
  private _rows = 0;
}
