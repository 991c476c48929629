/**
 * What one kernel's phalanx looks like to the panel: cluster, the kernel's
 * runs (the one shown and the newest, kept by `RunArchive`), learning networks
 * and the comm's connection state. No DOM here: views listen to `changed` and
 * read the getters.
 */
import { ISignal, Signal } from '@lumino/signaling';

import { IRunState, IRunSummary, RunArchive, rankState } from './archive';
import { MetricHistory } from './history';
import {
  IClusterEvent,
  IEngineLogEvent,
  INetworkEvent,
  MAX_WINDOW_POINTS,
  PhalanxEvent,
  SchemaError,
  validateEvent
} from './protocol';

export { MAX_HELD_RUNS } from './archive';
export type { IHistoryWindow, IRankState, IRunState, IRunSummary } from './archive';

/** no-kernel: nothing to follow; waiting: phalanx not loaded (yet); attached: live. */
export type ConnectionState = 'no-kernel' | 'waiting' | 'attached';

/** Which part of the state an update touched, so views redraw only that. */
export type ChangeKind = 'connection' | 'cluster' | 'run' | 'metrics' | 'network';

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

  /** The run shown: the one the person picked, else the newest. */
  get run(): IRunState | null {
    return this._runs.run;
  }

  /** The kernel's newest run, the only one that may be running, whatever is shown. */
  get latestRun(): IRunState | null {
    return this._runs.latestRun;
  }

  /** Every run of the kernel the panel knows of, oldest first. */
  get runs(): IRunSummary[] {
    return this._runs.runs;
  }

  /** The run the person picked (null: the newest is followed). */
  get picked(): string | null {
    return this._runs.picked;
  }

  /** The kernel's last answer to a log request (null: none asked since the last snapshot). */
  get engineLog(): IEngineLogEvent | null {
    return this._engineLog;
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
    if (!this._runs.pick(id)) {
      return;
    }
    this._changed.emit('run');
    this._changed.emit('metrics');
  }

  /**
   * The picked run whose record the kernel must be asked for, once: the panel
   * sends `Requests.run(id)` for what this returns.
   */
  takeWantedRecord(): string | null {
    return this._runs.takeWantedRecord();
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
        this._runs.keepPick();
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
        this._runs.setList(event.runs);
        this._changed.emit('run');
        return;
      case 'run_started':
        this._runs.start(event);
        this._changed.emit('run');
        return;
      case 'run_record':
        this._runs.holdRecord(event);
        this._changed.emit('run');
        this._changed.emit('metrics');
        return;
      case 'progress': {
        const run = this._runs.runFor(event.run);
        if (run) {
          for (const p of event.ranks) {
            run.ranks.set(p.rank, rankState(p));
          }
          this._changed.emit('run');
        }
        return;
      }
      case 'metrics': {
        const run = this._runs.runFor(event.run);
        if (run && run.history.add(event.rows) + run.history.addMeans(event.means) > 0) {
          this._changed.emit('metrics');
        }
        return;
      }
      case 'history_window': {
        const run = this._runs.held(event.run);
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
        const run = this._runs.runFor(event.run);
        if (run) {
          const store = event.type === 'time' ? run.times : run.memory;
          for (const entry of event.ranks) {
            (store as Map<number, typeof entry>).set(entry.rank, entry);
          }
          this._changed.emit('run');
        }
        return;
      }
      case 'run_ended':
        this._runs.end(event);
        this._changed.emit('run');
        return;
      case 'engine_log':
        this._engineLog = event;
        this._changed.emit('cluster');
        return;
    }
  }

  /** Forget everything about the kernel (it restarted or went away). */
  clear(): void {
    this._resetState(false);
    this._emitAll();
  }

  /** `keepPick`: a snapshot of the same kernel keeps the picked run (see `RunArchive.reset`). */
  private _resetState(keepPick: boolean): void {
    this._cluster = null;
    if (!keepPick) {
      this._engineLog = null; // another kernel's (a snapshot of the same kernel keeps it)
    }
    this._runs.reset(keepPick);
    this._networks = new Map();
  }

  private _emitAll(): void {
    for (const kind of ['cluster', 'run', 'metrics', 'network'] as const) {
      this._changed.emit(kind);
    }
  }

  private _changed = new Signal<this, ChangeKind>(this);
  private _connection: ConnectionState = 'no-kernel';
  private _cluster: IClusterEvent | null = null;
  private _engineLog: IEngineLogEvent | null = null;
  private _runs = new RunArchive();
  private _networks = new Map<string, INetworkEvent>();
  private _rejected = 0;
  private _logger: ILogger;
}
