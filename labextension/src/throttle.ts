/**
 * Coalesces render requests: however many updates arrive, the callback runs
 * at most once per interval (the panel's ~10 frames a second), and always
 * once after the last request so the final state is shown.
 */
import { IDisposable } from '@lumino/disposable';

export interface ITimers {
  setTimeout(fn: () => void, ms: number): unknown;
  clearTimeout(handle: unknown): void;
  now(): number;
}

const realTimers: ITimers = {
  setTimeout: (fn, ms) => setTimeout(fn, ms),
  clearTimeout: handle => clearTimeout(handle as ReturnType<typeof setTimeout>),
  now: () => Date.now()
};

export class Throttle implements IDisposable {
  constructor(
    private readonly _fn: () => void,
    readonly intervalMs = 100,
    private readonly _timers: ITimers = realTimers
  ) {}

  get isDisposed(): boolean {
    return this._disposed;
  }

  /** Ask for a run; it happens now-ish or at the end of the current interval. */
  schedule(): void {
    if (this._disposed || this._handle !== null) {
      return;
    }
    const wait = Math.max(0, this._last + this.intervalMs - this._timers.now());
    this._handle = this._timers.setTimeout(() => this._run(), wait);
  }

  dispose(): void {
    this._disposed = true;
    if (this._handle !== null) {
      this._timers.clearTimeout(this._handle);
      this._handle = null;
    }
  }

  private _run(): void {
    this._handle = null;
    this._last = this._timers.now();
    this._fn();
  }

  private _handle: unknown = null;
  private _last = -Infinity;
  private _disposed = false;
}
