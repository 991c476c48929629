/**
 * Turns per-rank series into the column layout uPlot draws: one shared x
 * column (steps), one column per rank, and the mean over ranks. Pure.
 */
import type { ISeries } from './history';

export interface IChartColumns {
  /** Ranks in column order (after x). */
  readonly ranks: number[];
  /** [steps, rank columns..., mean]; null where a rank has no value. */
  readonly data: [number[], ...(number | null)[][]];
}

/**
 * Align series on their steps. A rank that logged twice in a step keeps its
 * last value. With `positiveOnly` (log scale) values <= 0 become gaps. The
 * mean column is `meanSeries` where given, else the mean of the aligned ranks.
 */
export function alignSeries(
  byRank: ReadonlyMap<number, ISeries>,
  positiveOnly = false,
  meanSeries: ISeries | null = null
): IChartColumns {
  const ranks = [...byRank.keys()].sort((a, b) => a - b);
  const steps = new Set<number>();
  for (const series of [...byRank.values(), ...(meanSeries ? [meanSeries] : [])]) {
    for (const step of series.steps) {
      steps.add(step);
    }
  }
  const xs = [...steps].sort((a, b) => a - b);
  const index = new Map(xs.map((x, i) => [x, i]));
  const columns = ranks.map(rank => {
    const column: (number | null)[] = new Array(xs.length).fill(null);
    const { steps: s, values: v } = byRank.get(rank)!;
    for (let i = 0; i < s.length; i++) {
      column[index.get(s[i])!] = positiveOnly && v[i] <= 0 ? null : v[i];
    }
    return column;
  });
  if (meanSeries) {
    // The mean line kept beside the ranks' (exact at its steps, downsampled like them).
    const mean: (number | null)[] = new Array(xs.length).fill(null);
    meanSeries.steps.forEach((step, i) => {
      const value = meanSeries.values[i];
      mean[index.get(step)!] = positiveOnly && value <= 0 ? null : value;
    });
    return { ranks, data: [xs, ...columns, mean] };
  }
  const mean = xs.map((_, i) => {
    let sum = 0;
    let n = 0;
    for (const column of columns) {
      const value = column[i];
      if (value !== null) {
        sum += value;
        n += 1;
      }
    }
    return n > 0 ? sum / n : null;
  });
  return { ranks, data: [xs, ...columns, mean] };
}
