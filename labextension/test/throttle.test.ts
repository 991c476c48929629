import { describe, expect, it } from 'vitest';

import { ITimers, Throttle } from '../src/throttle';

class FakeTimers implements ITimers {
  time = 0;
  queue: { at: number; fn: () => void; id: number }[] = [];
  private _id = 0;
  setTimeout(fn: () => void, ms: number): unknown {
    const id = ++this._id;
    this.queue.push({ at: this.time + ms, fn, id });
    return id;
  }
  clearTimeout(handle: unknown): void {
    this.queue = this.queue.filter(t => t.id !== handle);
  }
  now(): number {
    return this.time;
  }
  advance(ms: number): void {
    const end = this.time + ms;
    for (;;) {
      const next = this.queue.filter(t => t.at <= end).sort((a, b) => a.at - b.at)[0];
      if (!next) {
        break;
      }
      this.queue = this.queue.filter(t => t !== next);
      this.time = next.at;
      next.fn();
    }
    this.time = end;
  }
}

describe('Throttle', () => {
  it('runs at most once per interval however often it is asked', () => {
    const timers = new FakeTimers();
    let runs = 0;
    const t = new Throttle(() => runs++, 100, timers);
    for (let ms = 0; ms < 1000; ms += 5) {
      t.schedule();
      timers.advance(5);
    }
    timers.advance(200);
    expect(runs).toBeGreaterThanOrEqual(9);
    expect(runs).toBeLessThanOrEqual(11);
  });

  it('always runs after the last request', () => {
    const timers = new FakeTimers();
    let runs = 0;
    const t = new Throttle(() => runs++, 100, timers);
    t.schedule();
    timers.advance(0);
    t.schedule(); // within the interval: deferred, not lost
    expect(runs).toBe(1);
    timers.advance(100);
    expect(runs).toBe(2);
  });

  it('does nothing after dispose', () => {
    const timers = new FakeTimers();
    let runs = 0;
    const t = new Throttle(() => runs++, 100, timers);
    t.schedule();
    t.dispose();
    t.schedule();
    timers.advance(1000);
    expect(runs).toBe(0);
  });
});
