/**
 * The wire protocol between the panel and the kernel: a mirror of
 * `kernel_ext/phalanx/events.py`. Keep the two in step; both ends validate,
 * and a message that does not fit is logged and dropped, never half-applied.
 */

export const SCHEMA_VERSION = 1;
export const COMM_TARGET = 'phalanx';

export const NODE_STATES = ['fresh', 'stale', 'queued', 'fitting', 'fitted', 'failed'] as const;
export const ENGINE_STATES = ['starting', 'idle', 'busy', 'dead', 'stopping'] as const;
export const RUN_STATES = ['running', 'done', 'failed', 'interrupted', 'timeout'] as const;

export type NodeState = (typeof NODE_STATES)[number];
export type EngineState = (typeof ENGINE_STATES)[number];
export type RunStatus = (typeof RUN_STATES)[number];

export interface IEngine {
  rank: number;
  engine_id: number;
  host: string;
  state: EngineState;
  pid?: number | null;
  device?: string | null;
  memory_mb?: number | null;
  step?: number | null;
  /** CUDA caching-allocator figures (MB), only for engines that use CUDA. */
  cuda_allocated_mb?: number | null;
  cuda_reserved_mb?: number | null;
  cuda_peak_mb?: number | null;
}

export interface IRankProgress {
  rank: number;
  step: number;
  total?: number | null;
  steps_per_s?: number | null;
  eta_s?: number | null;
  metrics?: Record<string, unknown>;
  straggler?: boolean;
}

export interface IMetricRow {
  rank: number;
  step: number;
  t: number;
  metrics: Record<string, number>;
}

export interface INetworkNode {
  id: string;
  label: string;
  kind: string;
  state: NodeState;
  fit_time_s?: number | null;
  estimator?: string | null;
  params?: Record<string, unknown> | null;
  last_action?: string | null;
}

interface IEventBase {
  v: number;
}

export interface IClusterEvent extends IEventBase {
  type: 'cluster';
  engines: IEngine[];
  max_engines: number;
  busy: boolean;
  error?: string | null;
  launcher?: string;
  /** A change asked for that waits for the run ("scale to 3 after run-4"). */
  notice?: string | null;
}

export interface IRunStartedEvent extends IEventBase {
  type: 'run_started';
  run: string;
  world_size: number;
  total_steps?: number | null;
  strategy?: string;
  /** The run's name (`--name`, else the kernel's default); the id is opaque. */
  name?: string | null;
}

export interface IProgressEvent extends IEventBase {
  type: 'progress';
  run: string;
  ranks: IRankProgress[];
}

/**
 * The mean over ranks of each metric by step, `{metric: [[step, mean], ...]}`,
 * taken by the kernel from every row (the rows a panel gets may be thinned).
 */
export type MeanPoints = Record<string, [number, number][]>;

export interface IMetricsEvent extends IEventBase {
  type: 'metrics';
  run: string;
  rows: IMetricRow[];
  means?: MeanPoints;
}

export interface IRunEndedEvent extends IEventBase {
  type: 'run_ended';
  run: string;
  status: RunStatus;
  wall_s: number;
  error?: string | null;
}

export interface INetworkEvent extends IEventBase {
  type: 'network';
  network: string;
  nodes: INetworkNode[];
  edges: [string, string][];
}

export interface ISnapshotEvent extends IEventBase {
  type: 'snapshot';
  events: PhalanxEvent[];
}

/** One rank's latest memory sample (MB = 2**20 bytes); CUDA fields only where CUDA is used. */
export interface IRankMemory {
  rank: number;
  t: number;
  rss_mb?: number | null;
  cuda_allocated_mb?: number | null;
  cuda_reserved_mb?: number | null;
  cuda_peak_mb?: number | null;
  cuda_total_mb?: number | null;
}

/** Each rank's memory, about once a second while a run goes. */
export interface IMemoryEvent extends IEventBase {
  type: 'memory';
  run: string;
  ranks: IRankMemory[];
}

/** A rank's seconds so far in phalanx collectives (waiting for the slowest peer / moving bytes) and in log(). */
export interface IRankTime {
  rank: number;
  collective_s: number;
  collective_wait_s: number;
  collective_move_s: number;
  collectives: number;
  log_s: number;
  /** Once the rank finished a step: steps, their seconds, and parts adding up to them. */
  steps?: number | null;
  step_s?: number | null;
  parts?: Record<string, number> | null;
  dominant?: string | null;
  dominant_share?: number | null;
  /** Set on a rank whose own work per step is well above the others': "data & forward 61% of step time". */
  slow?: string | null;
}

/** Each rank's time parts, sent when they change during a run. */
export interface ITimeEvent extends IEventBase {
  type: 'time';
  run: string;
  ranks: IRankTime[];
}

/** The kernel's answer to `request_window`: a zoomed chart's rows at full resolution. */
export interface IHistoryWindowEvent extends IEventBase {
  type: 'history_window';
  run: string;
  start: number;
  end: number;
  rows: IMetricRow[];
  means?: MeanPoints;
}

export type PhalanxEvent =
  | IClusterEvent
  | IRunStartedEvent
  | IProgressEvent
  | IMetricsEvent
  | IRunEndedEvent
  | INetworkEvent
  | ISnapshotEvent
  | IMemoryEvent
  | ITimeEvent
  | IHistoryWindowEvent;

export type PhalanxRequest =
  | { v: number; type: 'request_snapshot' }
  | { v: number; type: 'scale'; n: number }
  | { v: number; type: 'stop' }
  | { v: number; type: 'stop_run' }
  | {
      v: number;
      type: 'request_window';
      run: string;
      start: number;
      end: number;
      max_points?: number;
    }
  | { v: number; type: 'profile_next'; steps?: number };

/** The most points per line a zoomed chart may ask for (as in events.py). */
export const MAX_WINDOW_POINTS = 100_000;

/** A message that does not fit the schema; the message names the field. */
export class SchemaError extends Error {
  override name = 'SchemaError';
}

// --- field checks (same rules and wording as events.py) ----------------------

type Obj = Record<string, unknown>;
type Kind = 'int' | 'number' | 'string' | 'bool' | 'list' | 'object';

function isObject(value: unknown): value is Obj {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function fits(value: unknown, kind: Kind): boolean {
  switch (kind) {
    case 'int':
      return typeof value === 'number' && Number.isInteger(value);
    case 'number':
      return typeof value === 'number' && Number.isFinite(value);
    case 'string':
      return typeof value === 'string';
    case 'bool':
      return typeof value === 'boolean';
    case 'list':
      return Array.isArray(value);
    case 'object':
      return isObject(value);
  }
}

function need(msg: Obj, key: string, kind: Kind, where: string): unknown {
  if (!(key in msg)) {
    throw new SchemaError(`${where}: missing field '${key}'`);
  }
  const value = msg[key];
  if (!fits(value, kind)) {
    throw new SchemaError(`${where}: field '${key}' must be ${kind}`);
  }
  return value;
}

function optional(msg: Obj, key: string, kind: Kind, where: string): void {
  if (msg[key] !== undefined && msg[key] !== null) {
    need(msg, key, kind, where);
  }
}

function oneOf<T extends string>(value: unknown, allowed: readonly T[], what: string): void {
  if (!allowed.includes(value as T)) {
    throw new SchemaError(`${what} ${JSON.stringify(value)} not one of ${allowed.join(', ')}`);
  }
}

function entries(msg: Obj, key: string, where: string): Obj[] {
  const list = need(msg, key, 'list', where) as unknown[];
  for (const item of list) {
    if (!isObject(item)) {
      throw new SchemaError(`${where}: each of '${key}' must be an object`);
    }
  }
  return list as Obj[];
}

function checkCluster(m: Obj): void {
  for (const e of entries(m, 'engines', 'cluster')) {
    need(e, 'rank', 'int', 'cluster');
    need(e, 'engine_id', 'int', 'cluster');
    need(e, 'host', 'string', 'cluster');
    oneOf(need(e, 'state', 'string', 'cluster'), ENGINE_STATES, 'cluster: engine state');
    for (const key of ['memory_mb', 'step', 'pid']) {
      optional(e, key, 'number', 'cluster');
    }
    for (const key of ['cuda_allocated_mb', 'cuda_reserved_mb', 'cuda_peak_mb']) {
      optional(e, key, 'number', 'cluster');
    }
  }
  need(m, 'max_engines', 'int', 'cluster');
  need(m, 'busy', 'bool', 'cluster');
  optional(m, 'error', 'string', 'cluster');
  optional(m, 'notice', 'string', 'cluster');
}

function checkRunStarted(m: Obj): void {
  need(m, 'run', 'string', 'run_started');
  need(m, 'world_size', 'int', 'run_started');
  optional(m, 'total_steps', 'number', 'run_started');
  optional(m, 'name', 'string', 'run_started');
}

function checkProgress(m: Obj): void {
  need(m, 'run', 'string', 'progress');
  for (const p of entries(m, 'ranks', 'progress')) {
    need(p, 'rank', 'int', 'progress');
    need(p, 'step', 'int', 'progress');
    for (const key of ['total', 'steps_per_s', 'eta_s']) {
      optional(p, key, 'number', 'progress');
    }
    optional(p, 'metrics', 'object', 'progress');
  }
}

function checkRows(m: Obj, where: string): void {
  for (const r of entries(m, 'rows', where)) {
    need(r, 'rank', 'int', where);
    need(r, 'step', 'int', where);
    need(r, 't', 'number', where);
    const metrics = need(r, 'metrics', 'object', where) as Obj;
    for (const [name, value] of Object.entries(metrics)) {
      if (!fits(value, 'number')) {
        throw new SchemaError(`${where}: metric '${name}' must be a number`);
      }
    }
  }
}

function checkMeans(m: Obj, where: string): void {
  if (m.means === undefined || m.means === null) {
    return;
  }
  const means = need(m, 'means', 'object', where) as Obj;
  for (const [name, points] of Object.entries(means)) {
    const ok =
      Array.isArray(points) &&
      points.every(
        p => Array.isArray(p) && p.length === 2 && fits(p[0], 'number') && fits(p[1], 'number')
      );
    if (!ok) {
      throw new SchemaError(`${where}: means of '${name}' must be a list of [step, mean] numbers`);
    }
  }
}

function checkMetrics(m: Obj): void {
  need(m, 'run', 'string', 'metrics');
  checkRows(m, 'metrics');
  checkMeans(m, 'metrics');
}

/** A step window `[start, end]` of one run. */
function checkWindow(m: Obj, where: string): void {
  need(m, 'run', 'string', where);
  const start = need(m, 'start', 'number', where) as number;
  const end = need(m, 'end', 'number', where) as number;
  if (end < start) {
    throw new SchemaError(`${where}: end (${end}) is before start (${start}); give start <= end`);
  }
}

function checkHistoryWindow(m: Obj): void {
  checkWindow(m, 'history_window');
  checkRows(m, 'history_window');
  checkMeans(m, 'history_window');
}

function checkWindowRequest(m: Obj): void {
  checkWindow(m, 'request_window');
  if (m.max_points !== undefined && m.max_points !== null) {
    const n = need(m, 'max_points', 'int', 'request_window') as number;
    if (n < 1 || n > MAX_WINDOW_POINTS) {
      throw new SchemaError(
        `request_window: max_points must be between 1 and ${MAX_WINDOW_POINTS}, got ${n}`
      );
    }
  }
}

function checkRunEnded(m: Obj): void {
  need(m, 'run', 'string', 'run_ended');
  oneOf(need(m, 'status', 'string', 'run_ended'), RUN_STATES, 'run_ended: status');
  need(m, 'wall_s', 'number', 'run_ended');
}

function checkNetwork(m: Obj): void {
  need(m, 'network', 'string', 'network');
  for (const n of entries(m, 'nodes', 'network')) {
    need(n, 'id', 'string', 'network');
    need(n, 'label', 'string', 'network');
    need(n, 'kind', 'string', 'network');
    oneOf(need(n, 'state', 'string', 'network'), NODE_STATES, 'network: node state');
    optional(n, 'fit_time_s', 'number', 'network');
  }
  for (const edge of need(m, 'edges', 'list', 'network') as unknown[]) {
    const pair = Array.isArray(edge) && edge.length === 2 && edge.every(x => typeof x === 'string');
    if (!pair) {
      throw new SchemaError('network: each edge must be a [source_id, target_id] pair of strings');
    }
  }
}

function checkSnapshot(m: Obj): void {
  for (const event of need(m, 'events', 'list', 'snapshot') as unknown[]) {
    const inner = validateEvent(event);
    if (inner.type === 'snapshot') {
      throw new SchemaError('snapshot: a snapshot cannot contain a snapshot');
    }
  }
}

/** An event of one run with a `ranks` list of `{rank, <numbers>}` entries. */
function checkPerRank(m: Obj, kind: string, required: string[], optionalKeys: string[] = []): void {
  need(m, 'run', 'string', kind);
  for (const entry of entries(m, 'ranks', kind)) {
    need(entry, 'rank', 'int', kind);
    for (const key of required) {
      need(entry, key, 'number', kind);
    }
    for (const key of optionalKeys) {
      optional(entry, key, 'number', kind);
    }
  }
}

function checkMemory(m: Obj): void {
  checkPerRank(
    m,
    'memory',
    ['t'],
    ['rss_mb', 'cuda_allocated_mb', 'cuda_reserved_mb', 'cuda_peak_mb', 'cuda_total_mb']
  );
}

function checkTime(m: Obj): void {
  checkPerRank(
    m,
    'time',
    ['collective_s', 'collective_wait_s', 'collective_move_s', 'collectives', 'log_s'],
    ['steps', 'step_s', 'dominant_share']
  );
  for (const entry of entries(m, 'ranks', 'time')) {
    const parts = entry.parts;
    if (parts !== undefined && parts !== null) {
      if (typeof parts !== 'object' || Array.isArray(parts)) {
        throw new SchemaError("time: field 'parts' must be an object of part -> seconds");
      }
      for (const key of Object.keys(parts as Obj)) {
        need(parts as Obj, key, 'number', 'time parts');
      }
    }
    optional(entry, 'dominant', 'string', 'time');
    optional(entry, 'slow', 'string', 'time');
  }
}

const EVENT_CHECKS: Record<PhalanxEvent['type'], (m: Obj) => void> = {
  cluster: checkCluster,
  run_started: checkRunStarted,
  progress: checkProgress,
  metrics: checkMetrics,
  run_ended: checkRunEnded,
  network: checkNetwork,
  snapshot: checkSnapshot,
  memory: checkMemory,
  time: checkTime,
  history_window: checkHistoryWindow
};

const REQUEST_CHECKS: Record<PhalanxRequest['type'], (m: Obj) => void> = {
  request_snapshot: () => undefined,
  scale: m => {
    const n = need(m, 'n', 'int', 'scale') as number;
    if (n < 1) {
      throw new SchemaError(`scale: n must be at least 1, got ${n}`);
    }
  },
  stop: () => undefined,
  stop_run: () => undefined,
  request_window: checkWindowRequest,
  profile_next: m => {
    if (m.steps !== undefined && m.steps !== null) {
      const steps = need(m, 'steps', 'int', 'profile_next') as number;
      if (steps < 1) {
        throw new SchemaError(`profile_next: steps must be at least 1, got ${steps}`);
      }
    }
  }
};

function validate<T>(msg: unknown, checks: Record<string, (m: Obj) => void>, kind: string): T {
  if (!isObject(msg)) {
    throw new SchemaError(`${kind} must be a JSON object`);
  }
  if (msg.v !== SCHEMA_VERSION) {
    throw new SchemaError(
      `${kind} has schema version ${JSON.stringify(msg.v)}; this side speaks ${SCHEMA_VERSION}`
    );
  }
  const type = msg.type;
  if (typeof type !== 'string' || !Object.hasOwn(checks, type)) {
    throw new SchemaError(
      `unknown ${kind} type ${JSON.stringify(type)}; known: ${Object.keys(checks).sort().join(', ')}`
    );
  }
  checks[type](msg);
  return msg as T;
}

/**
 * Check a kernel -> panel event; return it typed or throw SchemaError.
 *
 * Example: `validateEvent({v: 1, type: 'run_ended', run: 'r', status: 'done', wall_s: 1})`.
 */
export function validateEvent(msg: unknown): PhalanxEvent {
  return validate<PhalanxEvent>(msg, EVENT_CHECKS, 'event');
}

/** Check a panel -> kernel request (the panel validates what it sends, too). */
export function validateRequest(msg: unknown): PhalanxRequest {
  return validate<PhalanxRequest>(msg, REQUEST_CHECKS, 'request');
}

/** Request constructors: the only messages the panel ever sends. */
export namespace Requests {
  export function snapshot(): PhalanxRequest {
    return { v: SCHEMA_VERSION, type: 'request_snapshot' };
  }

  export function scale(n: number): PhalanxRequest {
    return validateRequest({ v: SCHEMA_VERSION, type: 'scale', n });
  }

  export function stop(): PhalanxRequest {
    return { v: SCHEMA_VERSION, type: 'stop' };
  }

  /** Stop the running run (the cluster stays). */
  export function stopRun(): PhalanxRequest {
    return { v: SCHEMA_VERSION, type: 'stop_run' };
  }

  /** Ask for `run`'s rows with `start <= step <= end`, up to `maxPoints` per line. */
  export function window(
    run: string,
    start: number,
    end: number,
    maxPoints?: number
  ): PhalanxRequest {
    return validateRequest({
      v: SCHEMA_VERSION,
      type: 'request_window',
      run,
      start,
      end,
      ...(maxPoints === undefined ? {} : { max_points: maxPoints })
    });
  }

  /** Record the next run's first `steps` optimizer steps on every rank (--profile). */
  export function profileNext(steps = 5): PhalanxRequest {
    return validateRequest({ v: SCHEMA_VERSION, type: 'profile_next', steps });
  }
}
