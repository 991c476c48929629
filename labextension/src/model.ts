/**
 * What one kernel's phalanx looks like to the panel: cluster, current run,
 * learning networks and the comm's connection state. No DOM here: views
 * listen to `changed` and read the getters.
 */
import { ISignal, Signal } from '@lumino/signaling';

import { MetricHistory } from './history';
import {
  IClusterEvent,
  INetworkEvent,
  IRankMemory,
  IRankProgress,
  IRankTime,
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

export interface IRankState {
  readonly rank: number;
  readonly step: number;
  readonly total: number | null;
  readonly stepsPerS: number | null;
  readonly etaS: number | null;
  readonly straggler: boolean;
  readonly metrics: Readonly<Record<string, unknown>>;
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

  get run(): IRunState | null {
    return this._run;
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
        this._resetState();
        for (const inner of event.events) {
          this.apply(inner);
        }
        for (const kind of ['cluster', 'run', 'metrics', 'network'] as const) {
          this._changed.emit(kind);
        }
        return;
      case 'cluster':
        this._cluster = event;
        this._changed.emit('cluster');
        return;
      case 'network':
        this._networks.set(event.network, event);
        this._changed.emit('network');
        return;
      case 'run_started':
        this._startRun(event.run, {
          name: event.name ?? null,
          worldSize: event.world_size,
          totalSteps: event.total_steps ?? null,
          strategy: event.strategy ?? null
        });
        this._changed.emit('run');
        return;
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
        const run = this._run;
        if (run && run.id === event.run) {
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
        const run = this._runFor(event.run);
        if (run) {
          run.status = event.status;
          run.wallS = event.wall_s;
          run.error = event.error ?? null;
          this._changed.emit('run');
        }
        return;
      }
    }
  }

  /** Forget everything about the kernel (it restarted or went away). */
  clear(): void {
    this._resetState();
    for (const kind of ['cluster', 'run', 'metrics', 'network'] as const) {
      this._changed.emit(kind);
    }
  }

  private _resetState(): void {
    this._cluster = null;
    this._run = null;
    this._networks = new Map();
  }

  private _startRun(
    id: string,
    info: Pick<IMutableRun, 'name' | 'worldSize' | 'totalSteps' | 'strategy'>
  ): IMutableRun {
    if (this._run && this._run.id === id) {
      // The same run again (a snapshot after live updates): keep its history.
      Object.assign(this._run, info);
      return this._run;
    }
    this._run = {
      id,
      ...info,
      status: 'running',
      wallS: null,
      error: null,
      ranks: new Map(),
      history: new MetricHistory(),
      window: null,
      times: new Map(),
      memory: new Map()
    };
    return this._run;
  }

  /**
   * The run an update belongs to. Updates of an older run (its late end, a
   * straggling batch) are ignored; with no run known yet, one is started so a
   * panel that attached mid-stream still shows what it receives.
   */
  private _runFor(id: string): IMutableRun | null {
    if (!this._run) {
      return this._startRun(id, { name: null, worldSize: null, totalSteps: null, strategy: null });
    }
    return this._run.id === id ? this._run : null;
  }

  private _changed = new Signal<this, ChangeKind>(this);
  private _connection: ConnectionState = 'no-kernel';
  private _cluster: IClusterEvent | null = null;
  private _run: IMutableRun | null = null;
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
