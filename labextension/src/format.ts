/** Short human strings for the panel's numbers (pure, unit-tested). */

/** 0.4 -> "0.4 s", 75 -> "1 min 15 s", 4000 -> "1 h 6 min". */
export function duration(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) {
    return '–';
  }
  if (seconds < 10) {
    return `${seconds.toFixed(1)} s`;
  }
  const s = Math.round(seconds);
  if (s < 60) {
    return `${s} s`;
  }
  if (s < 3600) {
    return `${Math.floor(s / 60)} min ${s % 60} s`;
  }
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}

/**
 * A run's wall time, the figure its run_ended event carries, as the cell's
 * summary says it: 2.31 -> "2.31 s" (so the panel and the notebook read the
 * same); from a minute on as the cell's live view does: 75 -> "1 min 15 s",
 * 3725 -> "1 h 02 min".
 */
export function wallTime(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds) || seconds < 0) {
    return '–';
  }
  if (seconds < 59.995) {
    return `${seconds.toFixed(2)} s`;
  }
  const s = Math.round(seconds);
  const pad = (n: number): string => String(n).padStart(2, '0');
  if (s < 3600) {
    return `${Math.floor(s / 60)} min ${pad(s % 60)} s`;
  }
  return `${Math.floor(s / 3600)} h ${pad(Math.floor((s % 3600) / 60))} min`;
}

/** A fit time: "6 ms" below a second (where "0.00 s" would hide it), else "1.23 s". */
export function fitTime(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) {
    return '–';
  }
  if (seconds < 1) {
    const ms = seconds * 1000;
    return ms < 1 ? '<1 ms' : `${Math.round(ms)} ms`;
  }
  return seconds < 10 ? `${seconds.toFixed(2)} s` : `${Math.round(seconds)} s`;
}

/** Megabytes as MB below 1 GB, else GB with one decimal. */
export function memory(mb: number | null | undefined): string {
  if (mb === null || mb === undefined || !Number.isFinite(mb)) {
    return '–';
  }
  return mb < 1024 ? `${Math.round(mb)} MB` : `${(mb / 1024).toFixed(1)} GB`;
}

/** Steps per second with sensible precision. */
export function rate(perSecond: number | null | undefined): string {
  if (perSecond === null || perSecond === undefined || !Number.isFinite(perSecond)) {
    return '–';
  }
  return `${perSecond >= 100 ? Math.round(perSecond) : perSecond.toPrecision(3)} steps/s`;
}

/** A metric value: 4 significant digits, exponent form when tiny or huge. */
export function metric(value: unknown): string {
  if (typeof value !== 'number' || !Number.isFinite(value)) {
    return String(value);
  }
  const abs = Math.abs(value);
  return abs !== 0 && (abs < 1e-3 || abs >= 1e5)
    ? value.toExponential(3)
    : `${+value.toPrecision(4)}`;
}

/** Any parameter value as one line. */
export function param(value: unknown): string {
  return typeof value === 'string' ? value : (JSON.stringify(value) ?? String(value));
}
