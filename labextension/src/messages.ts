/**
 * The messages between the panel and the kernel, as types: what
 * `kernel_ext/phalanx/events.py` builds. The rest of the extension reads
 * events through these; `protocol.ts` checks that a message fits them.
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
  /** A run that did not finish: the first line of the cell's error (rank, exception, step). */
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

/** One of the kernel's runs as the run list shows it. */
export interface IRunEntry {
  run: string;
  name?: string | null;
  status: RunStatus;
  world_size: number;
  /** The run's wall time as its `run_ended` said (null while it runs). */
  wall_s?: number | null;
  error?: string | null;
}

/** Every run the kernel keeps, oldest first (in a snapshot; live runs follow as events). */
export interface IRunsEvent extends IEventBase {
  type: 'runs';
  runs: IRunEntry[];
}

/**
 * The kernel's record of an earlier run, answering `request_run`: how it ended,
 * each rank's last progress and step parts. Its curves follow as `metrics` events.
 */
export interface IRunRecordEvent extends IEventBase {
  type: 'run_record';
  run: string;
  name?: string | null;
  status: RunStatus;
  world_size: number;
  total_steps?: number | null;
  strategy?: string | null;
  wall_s?: number | null;
  error?: string | null;
  ranks: IRankProgress[];
  times: IRankTime[];
}

/**
 * The kernel's answer to `request_log`: the cluster log's file and last lines,
 * what the engines and the controller said that is not the user's (their
 * running processes' output so far included).
 */
export interface IEngineLogEvent extends IEventBase {
  type: 'engine_log';
  /** The log file (null before any cluster started in the kernel). */
  path?: string | null;
  lines: string[];
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
  | IHistoryWindowEvent
  | IRunsEvent
  | IRunRecordEvent
  | IEngineLogEvent;

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
  | { v: number; type: 'profile_next'; steps?: number }
  | { v: number; type: 'request_run'; run: string }
  | { v: number; type: 'request_log'; lines?: number };

/** The most points per line a zoomed chart may ask for (as in events.py). */
export const MAX_WINDOW_POINTS = 100_000;
/** The most lines of the cluster log the panel may ask for (as in events.py). */
export const MAX_LOG_LINES = 2000;
