import { describe, expect, it } from 'vitest';

import { M4Line } from '../src/m4';

/** A deterministic generator so a failing seed can be replayed. */
function random(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s * 1664525 + 1013904223) >>> 0;
    return s / 2 ** 32;
  };
}

describe('M4Line', () => {
  it('keeps a line exactly until it outgrows its budget', () => {
    const line = new M4Line(100);
    for (let i = 0; i < 100; i++) {
      line.add(i, i * i);
    }
    expect(line.points().xs).toEqual(Array.from({ length: 100 }, (_, i) => i));
    expect(line.width).toBe(1);
    line.add(100, 0);
    expect(line.width).toBeGreaterThan(1);
    expect(line.points().xs.length).toBeLessThanOrEqual(100);
  });

  for (const seed of [1, 2, 3, 4, 5, 6]) {
    it(`stays bounded and keeps first, last, global min and max (seed ${seed})`, () => {
      const next = random(seed);
      const line = new M4Line(400);
      const n = 50_000 + Math.floor(next() * 150_000);
      const spikeAt = Math.floor(next() * n);
      const dipAt = Math.floor(next() * n);
      let lo = Infinity;
      let hi = -Infinity;
      let last = 0;
      for (let i = 0; i < n; i++) {
        let y = Math.sin(i / 500) + next() * 0.1;
        y = i === spikeAt ? 50 : i === dipAt ? -50 : y;
        lo = Math.min(lo, y);
        hi = Math.max(hi, y);
        last = y;
        line.add(i, y);
        if (i % 9973 === 0) {
          expect(line.points().xs.length).toBeLessThanOrEqual(400);
        }
      }
      const { xs, ys } = line.points();
      expect(line.count).toBe(n);
      expect(xs.length).toBeLessThanOrEqual(400);
      expect(xs.length).toBeGreaterThan(100); // the budget is used, not collapsed
      expect(Math.max(...ys)).toBe(hi);
      expect(Math.min(...ys)).toBe(lo);
      expect(xs).toContain(spikeAt);
      expect(xs).toContain(dipAt);
      expect(xs[0]).toBe(0);
      expect(xs[xs.length - 1]).toBe(n - 1);
      expect(ys[ys.length - 1]).toBe(last);
      for (let i = 1; i < xs.length; i++) {
        expect(xs[i]).toBeGreaterThan(xs[i - 1]); // drawn in x order, no point twice
      }
    });
  }

  it('skips values that cannot be drawn', () => {
    const line = new M4Line(8);
    line.add(0, 1);
    line.add(1, NaN);
    line.add(2, Infinity);
    line.add(3, 2);
    expect(line.points()).toEqual({ xs: [0, 3], ys: [1, 2] });
    expect(line.count).toBe(2);
  });

  it('caches the drawn points until something is added', () => {
    const line = new M4Line(8);
    line.add(0, 1);
    const drawn = line.points();
    expect(line.points()).toBe(drawn);
    line.add(1, 2);
    expect(line.points()).not.toBe(drawn);
  });
});
