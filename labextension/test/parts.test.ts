import { describe, expect, it } from 'vitest';

import { engineColumns, withLiveMemory } from '../src/engines';
import { PhalanxModel } from '../src/model';
import { partShares } from '../src/panel/parts';
import { Requests, SchemaError } from '../src/protocol';
import type { IRankTime, PhalanxEvent } from '../src/protocol';
import fixtures from './fixtures/messages.json';
import { cluster, started } from './events';

const timeEvent = (fixtures.valid_events as unknown as PhalanxEvent[]).find(
  e => e.type === 'time' && e.ranks.some(r => r.parts)
) as Extract<PhalanxEvent, { type: 'time' }>;

describe('partShares', () => {
  it('gives each part its share of the step time, in stacking order', () => {
    const slow = timeEvent.ranks[1];
    const shares = partShares(slow);
    expect(shares.map(s => s.part)).toEqual([
      'data',
      'backward',
      'wait',
      'move',
      'optimizer',
      'log',
      'other'
    ]);
    expect(shares.reduce((a, s) => a + s.share, 0)).toBeCloseTo(1, 6);
    expect(shares[0]).toMatchObject({ label: 'data & forward', seconds: 1.0 });
  });

  it('is empty before a step is done, and says backward is inside data where unhooked', () => {
    const bare: IRankTime = {
      rank: 0,
      collective_s: 0,
      collective_wait_s: 0,
      collective_move_s: 0,
      collectives: 0,
      log_s: 0
    };
    expect(partShares(bare)).toEqual([]);
    expect(partShares(undefined)).toEqual([]);
    const ddp = { ...bare, steps: 1, step_s: 1, parts: { data: 0.9, backward: 0, other: 0.1 } };
    expect(partShares(ddp)[0].label).toBe('data, forward & backward');
  });
});

describe('live memory in the cluster table', () => {
  it('lays a run’s memory samples over the engines and shows a GPU column when reported', () => {
    const engines = cluster(2).engines;
    const live = new Map([
      [1, { rank: 1, t: 1, rss_mb: 900, cuda_allocated_mb: 100, cuda_reserved_mb: 200 }]
    ]);
    const shown = withLiveMemory(engines, live);
    expect(shown[1].memory_mb).toBe(900);
    expect(shown[0].memory_mb).toBe(engines[0].memory_mb);
    expect(engineColumns(shown)).toContain('gpu memory');
    expect(engineColumns(engines)).not.toContain('gpu memory');
  });
});

describe('PhalanxModel time and memory', () => {
  it('keeps each rank’s latest time parts and memory sample of the current run', () => {
    const model = new PhalanxModel();
    model.apply(started('run-1'));
    model.apply({ ...timeEvent, run: 'run-1' });
    model.apply({ v: 1, type: 'memory', run: 'run-1', ranks: [{ rank: 0, t: 1, rss_mb: 512 }] });
    model.apply({ v: 1, type: 'memory', run: 'old', ranks: [{ rank: 0, t: 1, rss_mb: 1 }] });
    expect(model.run?.times.get(1)?.slow).toContain('data');
    expect(model.run?.memory.get(0)?.rss_mb).toBe(512);
  });
});

describe('Requests.profileNext', () => {
  it('asks for the next run to be profiled, 5 steps unless told', () => {
    expect(Requests.profileNext()).toEqual({ v: 1, type: 'profile_next', steps: 5 });
    expect(Requests.profileNext(3)).toEqual({ v: 1, type: 'profile_next', steps: 3 });
    expect(() => Requests.profileNext(0)).toThrow(SchemaError);
  });
});
