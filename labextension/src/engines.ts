/**
 * Pure rules for the Cluster section: which engine-table columns carry
 * information, and when a request the panel sent has been answered. No DOM.
 */
import type { IRankState } from './model';
import type { IClusterEvent, IEngine, IRankMemory } from './protocol';

export const ENGINE_COLUMNS = [
  'rank',
  'host',
  'device',
  'state',
  'memory',
  'gpu memory',
  'step'
] as const;
export type EngineColumn = (typeof ENGINE_COLUMNS)[number];

/**
 * The columns worth showing for `engines`: memory, GPU memory and step only
 * when some engine reports them, since a column of dashes tells a person nothing.
 */
export function engineColumns(engines: readonly IEngine[]): EngineColumn[] {
  const reported = (key: 'memory_mb' | 'cuda_reserved_mb' | 'step'): boolean =>
    engines.some(e => e[key] !== null && e[key] !== undefined);
  return ENGINE_COLUMNS.filter(
    c =>
      (c !== 'memory' || reported('memory_mb')) &&
      (c !== 'gpu memory' || reported('cuda_reserved_mb')) &&
      (c !== 'step' || reported('step'))
  );
}

/**
 * The engines with the run's live memory samples (about 1 Hz) laid over the
 * cluster event's figures: between runs the cluster events carry memory,
 * during a run the `memory` events do. Ranks match the engines' ranks.
 */
export function withLiveMemory(
  engines: readonly IEngine[],
  live: ReadonlyMap<number, IRankMemory> | null
): IEngine[] {
  if (!live || live.size === 0) {
    return [...engines];
  }
  return engines.map(e => {
    const m = live.get(e.rank);
    if (!m) {
      return e;
    }
    return {
      ...e,
      memory_mb: m.rss_mb ?? e.memory_mb,
      cuda_allocated_mb: m.cuda_allocated_mb ?? e.cuda_allocated_mb,
      cuda_reserved_mb: m.cuda_reserved_mb ?? e.cuda_reserved_mb,
      cuda_peak_mb: m.cuda_peak_mb ?? e.cuda_peak_mb
    };
  });
}

/** What `withRunState` needs of the kernel's newest run. */
export interface IRunningRun {
  readonly status: string;
  readonly worldSize: number | null;
  readonly ranks: ReadonlyMap<number, Pick<IRankState, 'step'>>;
}

/**
 * The engines as a person should see them while `run` trains: the run's
 * ranks `busy` at their step. The kernel's cluster events say `idle` through
 * a run (its cluster layer keeps a slot idle while the run's engines train),
 * as `merge_rows` in widgets/_cluster_table.py corrects for the notebook's table.
 */
export function withRunState(engines: readonly IEngine[], run: IRunningRun | null): IEngine[] {
  if (!run || run.status !== 'running') {
    return [...engines];
  }
  const world = run.worldSize ?? Math.max(-1, ...run.ranks.keys()) + 1;
  return engines.map(e => {
    const training = e.rank < world || run.ranks.has(e.rank);
    const step = run.ranks.get(e.rank)?.step;
    return {
      ...e,
      state: training && e.state === 'idle' ? 'busy' : e.state,
      step: step ?? e.step
    };
  });
}

/**
 * A scale or stop request the kernel has not answered yet. The kernel
 * answers each one with a cluster event (the new state, or the old one with
 * an error), and it may take a while: engines start slowly, and the request
 * waits while a cell runs. Until then the panel says what it waits for.
 */
export class PendingRequest {
  /**
   * `before`: the cluster state shown when the request was sent; `target`:
   * the engine count asked for (null for stop).
   */
  constructor(
    readonly label: string,
    private readonly _before: IClusterEvent | null,
    readonly target: number | null = null
  ) {}

  /** Whether `cluster` (the model's current state) is the kernel's answer. */
  answeredBy(cluster: IClusterEvent | null): boolean {
    return cluster !== this._before;
  }
}
