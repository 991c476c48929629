/**
 * The kernel's runs as the panel keeps them: the run list, the few runs whose
 * curves it holds, which one is shown, and which records it has asked the
 * kernel for. No signals: `PhalanxModel` applies the events and says what changed.
 */
import { MetricHistory } from './history';
import type {
  IRankMemory,
  IRankProgress,
  IRankTime,
  IRunEndedEvent,
  IRunEntry,
  IRunRecordEvent,
  IRunStartedEvent,
  RunStatus
} from './protocol';

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

type Mutable<T> = { -readonly [K in keyof T]: T[K] };

/** A held run as the model updates it (progress, curves, times, memory). */
export interface IMutableRun extends Mutable<Omit<IRunState, 'ranks' | 'times' | 'memory'>> {
  ranks: Map<number, IRankState>;
  times: Map<number, IRankTime>;
  memory: Map<number, IRankMemory>;
}

type RunInfo = Pick<IMutableRun, 'name' | 'worldSize' | 'totalSteps' | 'strategy'>;

export class RunArchive {
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

  /**
   * Pick run `id` (null: follow the newest); false, and nothing changes, for
   * a run the list does not have. A run not held is held from its list entry,
   * not loaded, until the kernel's record arrives.
   */
  pick(id: string | null): boolean {
    const entry = id === null ? null : this._list.get(id);
    if (id !== null && !entry) {
      return false;
    }
    this._picked = id;
    if (entry && !this._states.has(entry.id)) {
      this._hold(newRun(entry.id, summaryInfo(entry), false, entry));
    }
    return true;
  }

  /** The picked run whose record the kernel must be asked for, once. */
  takeWantedRecord(): string | null {
    const run = this._picked === null ? null : this._states.get(this._picked);
    if (!run || run.loaded || this._asked.has(run.id)) {
      return null;
    }
    this._asked.add(run.id);
    return run.id;
  }

  /**
   * Forget every run; `keepPick`: a snapshot of the same kernel keeps the
   * picked run (and its curves if finished).
   */
  reset(keepPick: boolean): void {
    const picked = keepPick && this._picked !== null ? this._states.get(this._picked) : undefined;
    this._latest = null;
    this._list = new Map();
    this._states = new Map();
    this._asked = new Set();
    if (!keepPick) {
      this._picked = null;
    } else if (picked && picked.loaded && picked.status !== 'running') {
      this._states.set(picked.id, picked);
    }
  }

  /** After the kernel said which runs it has: a pick it no longer lists is let go. */
  keepPick(): void {
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

  /** The kernel's list of its runs (a `runs` event) replaces the one known. */
  setList(entries: readonly IRunEntry[]): void {
    this._list = new Map(entries.map(e => [e.run, summary(e)]));
    this.keepPick();
  }

  /** A run started: it is listed, held and the newest. */
  start(event: IRunStartedEvent): void {
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
  }

  /** The kernel's record of an earlier run arrived: hold it, loaded. */
  holdRecord(event: IRunRecordEvent): void {
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
  }

  /** A run ended: its list entry and, if held, its state say how. */
  end(event: IRunEndedEvent): void {
    const entry = this._list.get(event.run);
    if (entry) {
      this._list.set(event.run, { ...entry, ...ending(event) });
    }
    const run = this.runFor(event.run);
    if (run) {
      Object.assign(run, ending(event));
    }
  }

  /** The held run `id`, if held (nothing is started for it). */
  held(id: string): IMutableRun | undefined {
    return this._states.get(id);
  }

  /**
   * The run an update belongs to: a run the panel holds. Updates of a run it
   * does not hold are ignored, but with no run known yet one is started, so a
   * panel that attached mid-stream still shows what it receives.
   */
  runFor(id: string): IMutableRun | null {
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

  /** Runs whose curves the panel holds, by id (at most MAX_HELD_RUNS). */
  private _states = new Map<string, IMutableRun>();
  /** The kernel's runs, oldest first. */
  private _list = new Map<string, IRunSummary>();
  private _latest: string | null = null;
  private _picked: string | null = null;
  /** Runs whose record was asked for (asked once until it arrives or is let go). */
  private _asked = new Set<string>();
}

/** A rank's latest progress as the panel keeps it. */
export function rankState(p: IRankProgress): IRankState {
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
