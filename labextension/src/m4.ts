/**
 * Min/max-preserving downsampling (M4) of one line as its points arrive. Pure.
 *
 * Until a line outgrows its budget every point is kept. Past it, points are
 * grouped into buckets of `width` consecutive points and each bucket keeps its
 * first, lowest, highest and last point, so spikes, the line's global minimum
 * and maximum and its last point always show. When there are too many
 * buckets, neighbours merge pairwise (a merged bucket's four points follow
 * from those of its halves): the work per point is constant, nothing is
 * recomputed from raw points, and the width doubles once per doubling of the
 * line.
 *
 * Example:
 *   const line = new M4Line(400);
 *   for (let i = 0; i < 1e6; i++) line.add(i, Math.sin(i));
 *   line.points().xs.length <= 400; // true
 */

/** Points per line a chart draws by default: a few thousand pixels cannot show more. */
export const MAX_POINTS = 4000;

export interface IPoints {
  readonly xs: number[];
  readonly ys: number[];
}

interface IPoint {
  readonly x: number;
  readonly y: number;
}

interface IBucket {
  first: IPoint;
  low: IPoint;
  high: IPoint;
  last: IPoint;
}

function bucketOf(p: IPoint): IBucket {
  return { first: p, low: p, high: p, last: p };
}

/** The bucket covering `a` then `b`. */
function merge(a: IBucket, b: IBucket): IBucket {
  return {
    first: a.first,
    low: b.low.y < a.low.y ? b.low : a.low,
    high: b.high.y > a.high.y ? b.high : a.high,
    last: b.last
  };
}

export class M4Line {
  /** `maxPoints`: the most points `points()` ever returns (at least 8). */
  constructor(readonly maxPoints: number = MAX_POINTS) {
    this._maxBuckets = Math.max(2, Math.floor(maxPoints / 4));
  }

  /** Points added so far (not the drawn count). */
  get count(): number {
    return this._count;
  }

  /** Consecutive points per bucket; 1 while every point is kept. */
  get width(): number {
    return this._width;
  }

  /** Add one point (x in arrival order, normally increasing). Non-finite y is skipped. */
  add(x: number, y: number): void {
    if (!Number.isFinite(y)) {
      return;
    }
    this._count += 1;
    this._drawn = null;
    const p = { x, y };
    if (this._width === 1) {
      this._exact.push(p);
      if (this._exact.length > this.maxPoints) {
        this._done = this._exact.map(bucketOf);
        this._exact = [];
        this._shrink();
      }
      return;
    }
    this._open = this._open ? merge(this._open, bucketOf(p)) : bucketOf(p);
    this._openN += 1;
    if (this._openN === this._width) {
      this._done.push(this._open);
      this._open = null;
      this._openN = 0;
    }
    this._shrink();
  }

  /** The drawn points in x order; cached until the next `add`. */
  points(): IPoints {
    if (this._drawn) {
      return this._drawn;
    }
    const xs: number[] = [];
    const ys: number[] = [];
    const push = (p: IPoint, previous: IPoint | null): IPoint => {
      if (p !== previous) {
        xs.push(p.x);
        ys.push(p.y);
      }
      return p;
    };
    if (this._width === 1) {
      for (const p of this._exact) {
        xs.push(p.x);
        ys.push(p.y);
      }
    } else {
      const buckets = this._open ? [...this._done, this._open] : this._done;
      for (const b of buckets) {
        // The low and the high in their x order; a point kept twice is drawn once.
        const [mid1, mid2] = b.low.x <= b.high.x ? [b.low, b.high] : [b.high, b.low];
        let previous = push(b.first, null);
        previous = push(mid1, previous);
        previous = push(mid2, previous);
        push(b.last, previous);
      }
    }
    this._drawn = { xs, ys };
    return this._drawn;
  }

  private _buckets(): number {
    return this._done.length + (this._open ? 1 : 0);
  }

  /** Merge neighbouring buckets until the line fits its budget. */
  private _shrink(): void {
    while (this._buckets() > this._maxBuckets) {
      const done = this._done;
      if (done.length % 2 === 1) {
        // The odd one out starts the new, wider filling bucket.
        const last = done.pop()!;
        this._open = this._open ? merge(last, this._open) : last;
        this._openN += this._width;
      }
      const merged: IBucket[] = [];
      for (let i = 0; i < done.length; i += 2) {
        merged.push(merge(done[i], done[i + 1]));
      }
      this._done = merged;
      this._width *= 2;
    }
  }

  private _maxBuckets: number;
  private _count = 0;
  private _width = 1;
  private _exact: IPoint[] = [];
  private _done: IBucket[] = [];
  private _open: IBucket | null = null;
  private _openN = 0;
  private _drawn: IPoints | null = null;
}
