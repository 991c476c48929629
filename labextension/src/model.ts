/**
 * What one kernel's phalanx looks like to the panel: cluster, the kernel's
 * runs (the one shown and the newest), learning networks and the comm's
 * connection state. No DOM here: views listen to `changed` and read the getters.
 */
import { ISignal, Signal } from '@lumino/signaling';

import { MetricHistory } from './history';
import {
  IClusterEvent,
  INetworkEvent,
  IRankMemory,
  IRankProgress,
  IRankTime,
  IRunEntry,
  MAX_WINDOW_POINTS,
  PhalanxEvent,
  RunStatus,
  SchemaError,
  validateEvent
} from './protocol';

/** no-kernel: nothing to follow; waiting: phalanx not loaded (yet); attached: live. */
export type ConnectionState = 'no-kernel' | 'waiting' | 'attached';

/** Which part of the state an update touched, so views redraw only that. */
export type ChangeKind = 'connection' | 'cluster' | 'run' | 'metrics' | 'network';

/**
 * How many runs' curves the panel holds at once (the newest and the picked one
 * always among them); an earlier run dropped here is asked of the kernel again.
 */
export const MAX_HELD_RUNS = 4;

export interface IRankState {
  readonly rank: number;
  readonly step: number;
  readonly total: number | null;
  readonly stepsPerS: number | null;
  readonly etaS: number | null;
  readonly straggler: boolean;
  readonly metrics: Readonly<Record<string, unknown>>;
}

/** One of the kernel's runs as the run list shows it. */
export interface IRunSummary {
  readonly id: string;
  readonly name: string | null;
  readonly status: RunStatus;
  readonly worldSize: number | null;
  /** The wall time the run's `run_ended` said (null while it runs). */
  readonly wallS: number | null;
  readonly error: string | null;
}

export interface IRunState {
  readonly id: string;
  /** What the person called the run (null when the kernel did not say). */
  readonly name: string | null;
  readonly worldSize: number | null;
  readonly totalSteps: number | null;
  readonly strategy: string | null;
  readonly status: RunStatus;
  readonly wallS: number | null;
  readonly error: string | null;
  /** False while the kernel's record of a picked earlier run is on its way. */
  readonly loaded: boolean;
  /** Latest progress per rank, by rank. */
  readonly ranks: ReadonlyMap<number, IRankState>;
  /** Downsampled curves of the whole run (bounded however long it runs). */
  readonly history: MetricHistory;
  /** The last step window the kernel sent at full resolution (a zoomed chart), or null. */
  readonly window: IHistoryWindow | null;
  /** Latest time breakdown per rank (step parts, collectives), by rank. */
  readonly times: ReadonlyMap<number, IRankTime>;
  /** Latest memory sample per rank (RSS, CUDA), by rank. */
  readonly memory: ReadonlyMap<number, IRankMemory>;
}

/** Rows of one step window, as the kernel answered a zoomed chart. */
export interface IHistoryWindow {
  readonly start: number;
  readonly end: number;
  readonly history: MetricHistory;
}

/** A logger seam so tests can assert on dropped messages without console noise. */
export interface ILogger {
  warn(message: string): void;
}

type RunInfo = Pick<IMutableRun, 'name' | 'worldSize' | 'totalSteps' | 'strategy'>;

export class PhalanxModel {
  constructor(options: { logger?: ILogger } = {}) {
    this._logger = options.logger ?? console;
  }

  /** Emitted after every applied update with the part it touched. */
  get changed(): ISignal<this, ChangeKind> {
    return this._changed;
  }

  get connection(): ConnectionState {
    return this._connection;
  }

  get cluster(): IClusterEvent | null {
    return this._cluster;
  }

  /** The run shown: the one the person picked, else the newest. */
  get run(): IRunState | null {
    return this._states.get(this._picked ?? this._latest ?? '') ?? null;
  }

  /** The kernel's newest run, the only one that may be running, whatever is shown. */
  get latestRun(): IRunState | null {
    return this._states.get(this._latest ?? '') ?? null;
  }

  /** Every run of the kernel the panel knows of, oldest first. */
  get runs(): IRunSummary[] {
    return [...this._list.values()];
  }

  /** The run the person picked (null: the newest is followed). */
  get picked(): string | null {
    return this._picked;
  }

  /** Learning networks by name, in the order they first appeared. */
  get networks(): ReadonlyMap<string, INetworkEvent> {
    return this._networks;
  }

  /** How many incoming messages were rejected (shown in the panel's footer). */
  get rejected(): number {
    return this._rejected;
  }

  setConnection(state: ConnectionState): void {
    if (state !== this._connection) {
      this._connection = state;
      this._changed.emit('connection');
    }
  }

  /**
   * Show run `id` until the person picks another (a newer run does not take
   * its place); null follows the newest run again. A run whose curves the
   * panel does not hold is shown from its list entry until the kernel's
   * record arrives (see `takeWantedRecord`).
   */
  pick(id: string | null): void {
    const entry = id === null ? null : this._list.get(id);
    if (id !== null && !entry) {
      return;
    }
    this._picked = id;
    if (entry && !this._states.has(entry.id)) {
      this._hold(newRun(entry.id, summaryInfo(entry), false, entry));
    }
    this._changed.emit('run');
    this._changed.emit('metrics');
  }

  /**
   * The picked run whose record the kernel must be asked for, once: the panel
   * sends `Requests.run(id)` for what this returns.
   */
  takeWantedRecord(): string | null {
    const run = this._picked === null ? null : this._states.get(this._picked);
    if (!run || run.loaded || this._asked.has(run.id)) {
      return null;
    }
    this._asked.add(run.id);
    return run.id;
  }

  /**
   * Validate and apply one raw comm message. Invalid ones are logged and
   * dropped whole, so a bad message never leaves half-applied state.
   */
  receive(raw: unknown): boolean {
    let event: PhalanxEvent;
    try {
      event = validateEvent(raw);
    } catch (err) {
      if (!(err instanceof SchemaError)) {
        throw err;
      }
      this._rejected += 1;
      this._logger.warn(`phalanx: dropped an invalid message: ${err.message}`);
      return false;
    }
    this.apply(event);
    return true;
  }

  /** Apply one validated event. */
  apply(event: PhalanxEvent): void {
    switch (event.type) {
      case 'snapshot':
        // A snapshot is the whole truth: start over, then replay it.
        this._resetState(true);
        for (const inner of event.events) {
          this.apply(inner);
        }
        this._keepPick();
        this._emitAll();
        return;
      case 'cluster':
        this._cluster = event;
        this._changed.emit('cluster');
        return;
      case 'network':
        this._networks.set(event.network, event);
        this._changed.emit('network');
        return;
      case 'runs':
        this._list = new Map(event.runs.map(e => [e.run, summary(e)]));
        this._keepPick();
        this._changed.emit('run');
        return;
      case 'run_started':
        this._listRun({
          run: event.run,
          name: event.name,
          status: 'running',
          world_size: event.world_size
        });
        this._latest = event.run;
        this._startRun(event.run, {
          name: event.name ?? null,
          worldSize: event.world_size,
          totalSteps: event.total_steps ?? null,
          strategy: event.strategy ?? null
        });
        this._changed.emit('run');
        return;
      case 'run_record': {
        const entry = this._listRun(event);
        const run = newRun(event.run, summaryInfo(entry), true, entry);
        run.totalSteps = event.total_steps ?? null;
        run.strategy = event.strategy ?? null;
        for (const p of event.ranks) {
          run.ranks.set(p.rank, rankState(p));
        }
        for (const t of event.times) {
          run.times.set(t.rank, t);
        }
        this._hold(run);
        this._changed.emit('run');
        this._changed.emit('metrics');
        return;
      }
      case 'progress': {
        const run = this._runFor(event.run);
        if (run) {
          for (const p of event.ranks) {
            run.ranks.set(p.rank, rankState(p));
          }
          this._changed.emit('run');
        }
        return;
      }
      case 'metrics': {
        const run = this._runFor(event.run);
        if (run && run.history.add(event.rows) + run.history.addMeans(event.means) > 0) {
          this._changed.emit('metrics');
        }
        return;
      }
      case 'history_window': {
        const run = this._states.get(event.run);
        if (run) {
          const history = new MetricHistory(MAX_WINDOW_POINTS);
          history.add(event.rows);
          history.addMeans(event.means);
          run.window = { start: event.start, end: event.end, history };
          this._changed.emit('metrics');
        }
        return;
      }
      case 'time':
      case 'memory': {
        const run = this._runFor(event.run);
        if (run) {
          const store = event.type === 'time' ? run.times : run.memory;
          for (const entry of event.ranks) {
            (store as Map<number, typeof entry>).set(entry.rank, entry);
          }
          this._changed.emit('run');
        }
        return;
      }
      case 'run_ended': {
        const entry = this._list.get(event.run);
        if (entry) {
          this._list.set(event.run, { ...entry, ...ending(event) });
        }
        const run = this._runFor(event.run);
        if (run) {
          Object.assign(run, ending(event));
        }
        this._changed.emit('run');
        return;
      }
    }
  }

  /** Forget everything about the kernel (it restarted or went away). */
  clear(): void {
    this._resetState(false);
    this._emitAll();
  }

  /** `keepPick`: a snapshot of the same kernel keeps the picked run (and its curves if finished). */
  private _resetState(keepPick: boolean): void {
    const picked = keepPick && this._picked !== null ? this._states.get(this._picked) : undefined;
    this._cluster = null;
    this._latest = null;
    this._list = new Map();
    this._states = new Map();
    this._asked = new Set();
    this._networks = new Map();
    if (!keepPick) {
      this._picked = null;
    } else if (picked && picked.loaded && picked.status !== 'running') {
      this._states.set(picked.id, picked);
    }
  }

  /** After the kernel said which runs it has: a pick it no longer lists is let go. */
  private _keepPick(): void {
    if (this._picked === null) {
      return;
    }
    const entry = this._list.get(this._picked);
    if (!entry) {
      this._picked = null;
    } else if (!this._states.has(entry.id)) {
      this._hold(newRun(entry.id, summaryInfo(entry), false, entry));
    }
  }

  private _emitAll(): void {
    for (const kind of ['cluster', 'run', 'metrics', 'network'] as const) {
      this._changed.emit(kind);
    }
  }

  /** Add or update the run list's entry of a run; returns it. */
  private _listRun(info: IRunEntry): IRunSummary {
    const before = this._list.get(info.run);
    const entry: IRunSummary = {
      ...summary(info),
      // run_started says nothing of the end: what the list knew stays
      ...(before && info.status === 'running' && before.status !== 'running'
        ? { status: before.status, wallS: before.wallS, error: before.error }
        : {})
    };
    this._list.set(info.run, entry);
    return entry;
  }

  private _startRun(id: string, info: RunInfo): IMutableRun {
    const known = this._states.get(id);
    if (known) {
      // The same run again (a snapshot after live updates): keep its history.
      Object.assign(known, info, { loaded: true });
      return known;
    }
    return this._hold(newRun(id, info, true));
  }

  /** Keep `run`'s state, letting go of the oldest held ones but the newest and the picked. */
  private _hold(run: IMutableRun): IMutableRun {
    this._states.delete(run.id);
    this._states.set(run.id, run);
    for (const id of this._states.keys()) {
      if (this._states.size <= MAX_HELD_RUNS) {
        break;
      }
      if (id !== this._latest && id !== this._picked && id !== run.id) {
        this._states.delete(id);
        this._asked.delete(id);
      }
    }
    return run;
  }

  /**
   * The run an update belongs to: a run the panel holds. Updates of a run it
   * does not hold are ignored, but with no run known yet one is started, so a
   * panel that attached mid-stream still shows what it receives.
   */
  private _runFor(id: string): IMutableRun | null {
    const known = this._states.get(id);
    if (known) {
      return known;
    }
    if (this._latest !== null) {
      return null;
    }
    this._latest = id;
    this._listRun({ run: id, status: 'running', world_size: 0 });
    return this._startRun(id, { name: null, worldSize: null, totalSteps: null, strategy: null });
  }

  private _changed = new Signal<this, ChangeKind>(this);
  private _connection: ConnectionState = 'no-kernel';
  private _cluster: IClusterEvent | null = null;
  /** Runs whose curves the panel holds, by id (at most MAX_HELD_RUNS). */
  private _states = new Map<string, IMutableRun>();
  /** The kernel's runs, oldest first. */
  private _list = new Map<string, IRunSummary>();
  private _latest: string | null = null;
  private _picked: string | null = null;
  /** Runs whose record was asked for (asked once until it arrives or is let go). */
  private _asked = new Set<string>();
  private _networks = new Map<string, INetworkEvent>();
  private _rejected = 0;
  private _logger: ILogger;
}

type Mutable<T> = { -readonly [K in keyof T]: T[K] };

interface IMutableRun extends Mutable<Omit<IRunState, 'ranks' | 'times' | 'memory'>> {
  ranks: Map<number, IRankState>;
  times: Map<number, IRankTime>;
  memory: Map<number, IRankMemory>;
}

function newRun(
  id: string,
  info: RunInfo,
  loaded: boolean,
  end: Pick<IRunSummary, 'status' | 'wallS' | 'error'> = {
    status: 'running',
    wallS: null,
    error: null
  }
): IMutableRun {
  return {
    id,
    ...info,
    status: end.status,
    wallS: end.wallS,
    error: end.error,
    loaded,
    ranks: new Map(),
    history: new MetricHistory(),
    window: null,
    times: new Map(),
    memory: new Map()
  };
}

function summary(e: IRunEntry): IRunSummary {
  return {
    id: e.run,
    name: e.name ?? null,
    status: e.status,
    worldSize: e.world_size > 0 ? e.world_size : null,
    wallS: e.wall_s ?? null,
    error: e.error ?? null
  };
}

function summaryInfo(e: IRunSummary): RunInfo {
  return { name: e.name, worldSize: e.worldSize, totalSteps: null, strategy: null };
}

function ending(e: {
  status: RunStatus;
  wall_s: number;
  error?: string | null;
}): Pick<IRunSummary, 'status' | 'wallS' | 'error'> {
  return { status: e.status, wallS: e.wall_s, error: e.error ?? null };
}

function rankState(p: IRankProgress): IRankState {
  return {
    rank: p.rank,
    step: p.step,
    total: p.total ?? null,
    stepsPerS: p.steps_per_s ?? null,
    etaS: p.eta_s ?? null,
    straggler: p.straggler === true,
    metrics: p.metrics ?? {}
  };
}
