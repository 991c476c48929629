import { describe, expect, it } from 'vitest';

import { withRunState } from '../src/engines';
import * as fmt from '../src/format';
import { MAX_HELD_RUNS, PhalanxModel } from '../src/model';
import { captionParts, partShares } from '../src/panel/parts';
import { Requests } from '../src/protocol';
import type { IRunEntry, IRunRecordEvent } from '../src/protocol';
import { cluster, ended, metrics, progress, row, snapshot, started } from './events';

function entry(run: string, status: IRunEntry['status'] = 'done', wall = 2.5): IRunEntry {
  return { run, name: `${run}-name`, status, world_size: 2, wall_s: wall, error: null };
}

function record(run: string): IRunRecordEvent {
  return {
    v: 1,
    type: 'run_record',
    ...entry(run),
    total_steps: 10,
    strategy: 'allreduce',
    ranks: [
      { rank: 0, step: 10, total: 10 },
      { rank: 1, step: 10, total: 10 }
    ],
    times: []
  };
}

/** A model that saw run `id` live from start to end, with one row per rank. */
function sawRun(model: PhalanxModel, id: string, status: 'done' | 'failed' = 'done'): void {
  model.apply(started(id));
  model.apply(metrics(id, [row(0, 1, 1), row(1, 1, 2)]));
  model.apply({ ...ended(id, status), error: status === 'failed' ? 'rank 1 raised' : null });
}

describe('the run list', () => {
  it('lists the runs seen live, follows the newest, and keeps their ends', () => {
    const model = new PhalanxModel();
    sawRun(model, 'r1');
    sawRun(model, 'r2', 'failed');
    model.apply(started('r3'));
    expect(model.runs.map(r => [r.id, r.status, r.wallS, r.error])).toEqual([
      ['r1', 'done', 2.5, null],
      ['r2', 'failed', 2.5, 'rank 1 raised'],
      ['r3', 'running', null, null]
    ]);
    expect(model.run?.id).toBe('r3');
    expect(model.picked).toBeNull();
  });

  it('keeps a picked run shown when a newer run starts (a validation after training)', () => {
    const model = new PhalanxModel();
    sawRun(model, 'train');
    model.pick('train');
    sawRun(model, 'val');
    expect(model.run?.id).toBe('train');
    expect(model.run?.history.series('loss').get(0)?.steps).toEqual([1]);
    expect(model.latestRun?.id).toBe('val');
    expect(model.takeWantedRecord()).toBeNull(); // held since it ran: nothing to ask
    model.pick(null);
    expect(model.run?.id).toBe('val');
  });

  it('asks once for the record of a run it does not hold, and shows it when it comes', () => {
    const model = new PhalanxModel();
    model.apply(snapshot([{ v: 1, type: 'runs', runs: [entry('a'), entry('b')] }, started('b')]));
    model.pick('a');
    expect(model.run).toMatchObject({ id: 'a', loaded: false, status: 'done', wallS: 2.5 });
    expect(model.takeWantedRecord()).toBe('a');
    expect(model.takeWantedRecord()).toBeNull();
    model.apply(record('a'));
    model.apply(metrics('a', [row(0, 1, 3), row(0, 2, 2)]));
    expect(model.run).toMatchObject({ id: 'a', loaded: true, totalSteps: 10 });
    expect(model.run?.ranks.get(1)?.step).toBe(10);
    expect(model.run?.history.series('loss').get(0)?.steps).toEqual([1, 2]);
    model.pick('nope'); // not listed: nothing changes
    expect(model.picked).toBe('a');
  });

  it('lets a pick go when the kernel no longer lists the run, and on a restart', () => {
    const model = new PhalanxModel();
    model.apply({ v: 1, type: 'runs', runs: [entry('a'), entry('b')] });
    model.pick('a');
    model.apply({ v: 1, type: 'runs', runs: [entry('b')] });
    expect(model.picked).toBeNull();
    model.pick('b');
    model.clear();
    expect([model.picked, model.run, model.runs]).toEqual([null, null, []]);
  });

  it('keeps a picked finished run across a snapshot of the same kernel', () => {
    const model = new PhalanxModel();
    sawRun(model, 'a');
    sawRun(model, 'b');
    model.pick('a');
    model.apply(snapshot([{ v: 1, type: 'runs', runs: [entry('a'), entry('b')] }, started('b')]));
    expect(model.run?.id).toBe('a');
    expect(model.run?.history.rowCount).toBe(2);
    expect(model.takeWantedRecord()).toBeNull();
  });

  it('holds a bounded number of runs, never the newest or the picked one dropped', () => {
    const model = new PhalanxModel();
    sawRun(model, 'r0');
    model.pick('r0');
    for (let i = 1; i <= MAX_HELD_RUNS + 2; i++) {
      sawRun(model, `r${i}`);
    }
    expect(model.run?.history.rowCount).toBe(2);
    model.pick('r1'); // dropped meanwhile: asked of the kernel again
    expect(model.run?.loaded).toBe(false);
    expect(model.takeWantedRecord()).toBe('r1');
  });

  it('builds the request for an earlier run', () => {
    expect(Requests.run('r1')).toEqual({ v: 1, type: 'request_run', run: 'r1' });
  });
});

describe('engines during a run', () => {
  it('shows the running run’s ranks busy at their step, idle again after', () => {
    const model = new PhalanxModel();
    model.apply(cluster(3));
    model.apply(started('r1', 2));
    model.apply(progress('r1', [{ rank: 0, step: 4 }]));
    const during = withRunState(model.cluster!.engines, model.latestRun);
    expect(during.map(e => [e.state, e.step])).toEqual([
      ['busy', 4],
      ['busy', null],
      ['idle', null]
    ]);
    model.apply(ended('r1'));
    const after = withRunState(model.cluster!.engines, model.latestRun);
    expect(after.map(e => e.state)).toEqual(['idle', 'idle', 'idle']);
  });

  it('leaves a dead engine dead', () => {
    const engines = cluster(2).engines.map(e => ({ ...e, state: 'dead' as const }));
    const run = { status: 'running', worldSize: 2, ranks: new Map() };
    expect(withRunState(engines, run).map(e => e.state)).toEqual(['dead', 'dead']);
  });
});

describe('one wall time everywhere', () => {
  it('says the run_ended figure as the cell does', () => {
    expect(fmt.wallTime(2.314)).toBe('2.31 s');
    expect(fmt.wallTime(59.999)).toBe('1 min 00 s');
    expect(fmt.wallTime(65)).toBe('1 min 05 s');
    expect(fmt.wallTime(3725)).toBe('1 h 02 min');
    expect(fmt.wallTime(null)).toBe('–');
  });
});

describe('the step parts caption', () => {
  it('names the largest parts first, so a cut caption keeps them', () => {
    const t = {
      rank: 0,
      collective_s: 0,
      collective_wait_s: 0,
      collective_move_s: 0,
      collectives: 0,
      log_s: 0,
      steps: 10,
      step_s: 1,
      parts: { data: 0.2, backward: 0.1, wait: 0.695, other: 0.005 }
    };
    expect(captionParts(partShares(t))).toBe(
      'waiting for a peer 70%, data & forward 20%, backward 10%'
    );
  });
});
