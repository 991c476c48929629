import { describe, expect, it } from 'vitest';

import { alignSeries } from '../src/chartdata';
import { MetricHistory } from '../src/history';
import { row } from './events';

describe('MetricHistory', () => {
  it('splits rows by metric and rank, keeping order', () => {
    const h = new MetricHistory();
    h.add([
      { rank: 0, step: 1, t: 1, metrics: { loss: 3, acc: 0.1 } },
      { rank: 1, step: 1, t: 1, metrics: { loss: 4 } },
      { rank: 0, step: 2, t: 2, metrics: { loss: 2 } }
    ]);
    expect(h.metricNames).toEqual(['loss', 'acc']);
    expect(h.series('loss').get(0)).toEqual({ steps: [1, 2], values: [3, 2] });
    expect(h.series('acc').get(1)).toBeUndefined();
    expect(h.series('missing').size).toBe(0);
    expect(h.rowCount).toBe(3);
  });

  it('keeps a short history whole and a long one bounded, extremes and last point kept', () => {
    const h = new MetricHistory(400);
    for (let i = 0; i < 100; i++) {
      h.add(
        Array.from({ length: 1000 }, (_, j) => row(j % 2, i * 500 + (j >> 1), 1, i * 1000 + j))
      );
      h.addMeans({
        loss: Array.from({ length: 500 }, (_, j): [number, number] => [i * 500 + j, 1])
      });
      if (i === 0) {
        const steps = h.series('loss').get(1)!.steps;
        expect(steps.length).toBeLessThan(400); // 500 > 400 points: bucketed
        expect(steps[steps.length - 1]).toBe(499);
      }
    }
    h.add([row(0, 60_000, 99, 200_000), row(1, 60_000, -5, 200_000)]);
    h.addMeans({ loss: [[60_000, 47]] });
    expect(h.rowCount).toBe(100_002 + 50_001);
    const r0 = h.series('loss').get(0)!;
    const r1 = h.series('loss').get(1)!;
    expect(r0.steps.length).toBeLessThanOrEqual(400);
    expect(Math.max(...r0.values)).toBe(99);
    expect(Math.min(...r1.values)).toBe(-5);
    expect(r1.steps[r1.steps.length - 1]).toBe(60_000);
    expect(h.maxLinePoints('loss')).toBeLessThanOrEqual(400);
    const mean = h.mean('loss')!;
    expect(mean.steps.length).toBeLessThanOrEqual(400);
    expect(mean.steps[mean.steps.length - 1]).toBe(60_000);
    expect(mean.values[mean.values.length - 1]).toBe(47);
  });

  it('draws the mean the kernel sends, not one taken from the rows it has', () => {
    const h = new MetricHistory();
    h.add([row(0, 1, 4), row(1, 1, 2), row(0, 2, 6)]);
    expect(h.mean('loss')).toBeNull(); // rows alone: no mean (they may be thinned)
    expect(h.addMeans({ loss: [[1, 3]] })).toBe(1);
    expect(h.mean('loss')).toEqual({ steps: [1], values: [3] });
    // a reloaded snapshot sends the line again: steps already drawn are skipped
    expect(
      h.addMeans({
        loss: [
          [1, 3],
          [2, 6],
          [3, 2]
        ]
      })
    ).toBe(2);
    expect(h.mean('loss')).toEqual({ steps: [1, 2, 3], values: [3, 6, 2] });
    expect(h.addMeans(undefined)).toBe(0);
  });

  it('accepts two rows of one step at different times, skips exact repeats', () => {
    const h = new MetricHistory();
    expect(h.add([row(0, 5, 1, 10), row(0, 5, 2, 11)])).toBe(2);
    expect(h.add([row(0, 5, 2, 11), row(0, 4, 9, 9)])).toBe(0);
    expect(h.add([row(0, 6, 1, 11)])).toBe(1); // same time, next step: new
  });
});

describe('alignSeries', () => {
  it('aligns ranks on steps with gaps and a mean column', () => {
    const h = new MetricHistory();
    h.add([row(0, 1, 4), row(1, 1, 2), row(0, 2, 3), row(1, 3, 1)]);
    const { ranks, data } = alignSeries(h.series('loss'));
    expect(ranks).toEqual([0, 1]);
    h.addMeans({
      loss: [
        [1, 3],
        [2, 3],
        [3, 1]
      ]
    });
    expect(alignSeries(h.series('loss'), false, h.mean('loss')).data[3]).toEqual([3, 3, 1]);
    expect(data).toEqual([
      [1, 2, 3],
      [4, 3, null],
      [2, null, 1],
      [3, 3, 1]
    ]);
  });

  it('turns non-positive values into gaps for a log scale', () => {
    const h = new MetricHistory();
    h.add([row(0, 1, 0), row(0, 2, -1), row(0, 3, 0.5)]);
    expect(alignSeries(h.series('loss'), true).data[1]).toEqual([null, null, 0.5]);
  });

  it('handles no data', () => {
    expect(alignSeries(new Map()).data).toEqual([[], []]);
  });
});
