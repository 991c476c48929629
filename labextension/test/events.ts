/** Small event builders for tests (the kernel builds these with events.py). */
import type {
  IClusterEvent,
  IMetricRow,
  IMetricsEvent,
  INetworkEvent,
  IProgressEvent,
  IRankProgress,
  IRunEndedEvent,
  IRunStartedEvent,
  ISnapshotEvent,
  PhalanxEvent
} from '../src/protocol';

export function cluster(n: number, extra: Partial<IClusterEvent> = {}): IClusterEvent {
  const engines = Array.from({ length: n }, (_, rank) => ({
    rank,
    engine_id: rank,
    host: 'node1',
    state: 'idle' as const,
    device: 'cpu',
    memory_mb: 100,
    step: null
  }));
  return {
    v: 1,
    type: 'cluster',
    engines,
    max_engines: 4,
    busy: false,
    error: null,
    launcher: 'local',
    ...extra
  };
}

export function started(run: string, worldSize = 2, total: number | null = 10): IRunStartedEvent {
  return {
    v: 1,
    type: 'run_started',
    run,
    world_size: worldSize,
    total_steps: total,
    strategy: 'allreduce'
  };
}

export function progress(run: string, ranks: IRankProgress[]): IProgressEvent {
  return { v: 1, type: 'progress', run, ranks };
}

export function row(rank: number, step: number, loss: number, t = step): IMetricRow {
  return { rank, step, t, metrics: { loss } };
}

export function metrics(run: string, rows: IMetricRow[]): IMetricsEvent {
  return { v: 1, type: 'metrics', run, rows };
}

export function ended(run: string, status: IRunEndedEvent['status'] = 'done'): IRunEndedEvent {
  return { v: 1, type: 'run_ended', run, status, wall_s: 2.5, error: null };
}

export function network(
  name: string,
  states: INetworkEvent['nodes'][number]['state'][]
): INetworkEvent {
  const nodes = states.map((state, i) => ({
    id: `n${i}`,
    label: `node ${i}`,
    kind: 'machine',
    state
  }));
  const edges = nodes.slice(1).map((n, i) => [nodes[i].id, n.id] as [string, string]);
  return { v: 1, type: 'network', network: name, nodes, edges };
}

export function snapshot(events: PhalanxEvent[]): ISnapshotEvent {
  return { v: 1, type: 'snapshot', events };
}
