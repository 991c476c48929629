import { describe, expect, it } from 'vitest';

import { ChangeKind, PhalanxModel } from '../src/model';
import { cluster, ended, metrics, network, progress, row, snapshot, started } from './events';

function modelWithLog(): { model: PhalanxModel; warnings: string[]; changes: ChangeKind[] } {
  const warnings: string[] = [];
  const model = new PhalanxModel({ logger: { warn: m => warnings.push(m) } });
  const changes: ChangeKind[] = [];
  model.changed.connect((_, kind) => changes.push(kind));
  return { model, warnings, changes };
}

describe('PhalanxModel', () => {
  it('starts empty and waiting for a kernel', () => {
    const model = new PhalanxModel();
    expect(model.connection).toBe('no-kernel');
    expect(model.cluster).toBeNull();
    expect(model.run).toBeNull();
    expect(model.networks.size).toBe(0);
  });

  it('keeps the latest cluster state', () => {
    const { model, changes } = modelWithLog();
    model.apply(cluster(2));
    model.apply(cluster(3));
    expect(model.cluster?.engines).toHaveLength(3);
    expect(changes).toEqual(['cluster', 'cluster']);
  });

  it('tracks a run: progress per rank, history, end', () => {
    const { model } = modelWithLog();
    model.apply(started('r1'));
    model.apply(progress('r1', [{ rank: 0, step: 3, total: 10, steps_per_s: 2, eta_s: 3.5 }]));
    model.apply(progress('r1', [{ rank: 1, step: 4, straggler: true }]));
    model.apply(progress('r1', [{ rank: 0, step: 5 }]));
    model.apply(metrics('r1', [row(0, 1, 2.0), row(1, 1, 2.2), row(0, 2, 1.5)]));
    model.apply(ended('r1'));
    const run = model.run!;
    expect(run.id).toBe('r1');
    expect(run.name).toBeNull();
    expect(run.totalSteps).toBe(10);
    expect(run.status).toBe('done');
    expect(run.wallS).toBe(2.5);
    expect([...run.ranks.values()].map(r => [r.rank, r.step, r.straggler])).toEqual([
      [0, 5, false],
      [1, 4, true]
    ]);
    expect(run.history.rowCount).toBe(3);
    expect(run.history.series('loss').get(0)).toEqual({ steps: [1, 2], values: [2.0, 1.5] });
  });

  it('keeps the run name the kernel sends', () => {
    const { model } = modelWithLog();
    expect(model.receive({ ...started('9c2b-1'), name: 'panel-run' })).toBe(true);
    expect(model.run?.name).toBe('panel-run');
    expect(model.receive({ ...started('9c2b-2'), name: 5 })).toBe(false);
  });

  it('starts over on a new run and ignores late updates of the old one', () => {
    const { model } = modelWithLog();
    model.apply(started('r1'));
    model.apply(metrics('r1', [row(0, 1, 1)]));
    model.apply(started('r2'));
    model.apply(metrics('r1', [row(0, 2, 1)]));
    model.apply(ended('r1', 'failed'));
    expect(model.run?.id).toBe('r2');
    expect(model.run?.status).toBe('running');
    expect(model.run?.history.rowCount).toBe(0);
  });

  it('shows updates that arrive before their run_started', () => {
    const { model } = modelWithLog();
    model.apply(progress('r9', [{ rank: 0, step: 1 }]));
    expect(model.run?.id).toBe('r9');
    model.apply(started('r9', 4, 20));
    expect(model.run?.worldSize).toBe(4);
    expect(model.run?.ranks.size).toBe(1);
  });

  it('keeps networks by name, newest state wins', () => {
    const { model } = modelWithLog();
    model.apply(network('a', ['fresh', 'fresh']));
    model.apply(network('b', ['fitted']));
    model.apply(network('a', ['fitted', 'fitting']));
    expect([...model.networks.keys()]).toEqual(['a', 'b']);
    expect(model.networks.get('a')?.nodes.map(n => n.state)).toEqual(['fitted', 'fitting']);
  });

  it('replaces everything with a snapshot', () => {
    const { model, changes } = modelWithLog();
    model.apply(cluster(3));
    model.apply(network('old', ['failed']));
    model.apply(started('r0'));
    changes.length = 0;
    model.apply(snapshot([cluster(2), started('r1'), progress('r1', [{ rank: 0, step: 2 }])]));
    expect(model.cluster?.engines).toHaveLength(2);
    expect(model.networks.size).toBe(0);
    expect(model.run?.id).toBe('r1');
    expect(model.run?.ranks.get(0)?.step).toBe(2);
    expect(new Set(changes)).toEqual(new Set(['cluster', 'run', 'metrics', 'network']));
  });

  it('does not duplicate rows seen live and again in a snapshot replay', () => {
    const { model } = modelWithLog();
    model.apply(started('r1'));
    model.apply(metrics('r1', [row(0, 1, 3), row(0, 2, 2)]));
    // A reattach: the snapshot starts over, the history chunks replay the rows,
    // and the first live batch overlaps the end of that history.
    model.apply(snapshot([started('r1')]));
    expect(model.run?.history.rowCount).toBe(0);
    model.apply(metrics('r1', [row(0, 1, 3), row(0, 2, 2)]));
    model.apply(metrics('r1', [row(0, 2, 2), row(0, 3, 1)]));
    expect(model.run?.history.series('loss').get(0)?.steps).toEqual([1, 2, 3]);
  });

  it('drops invalid messages whole, logs them and counts them', () => {
    const { model, warnings, changes } = modelWithLog();
    expect(
      model.receive({ v: 1, type: 'metrics', run: 'r', rows: [row(0, 1, 1), { rank: 'x' }] })
    ).toBe(false);
    expect(model.receive({ v: 99, type: 'cluster' })).toBe(false);
    expect(model.receive('garbage')).toBe(false);
    expect(model.run).toBeNull();
    expect(model.rejected).toBe(3);
    expect(warnings).toHaveLength(3);
    expect(warnings[0]).toMatch(/phalanx: dropped an invalid message: .*rank/);
    expect(changes).toEqual([]);
    expect(model.receive(cluster(1))).toBe(true);
  });

  it('keeps the cluster log the kernel answered with until the kernel goes', () => {
    const { model, changes } = modelWithLog();
    expect(model.engineLog).toBeNull();
    const lines = ['--- engine set 0 stopped (exit code 0)', 'Event loop stopped'];
    expect(model.receive({ v: 1, type: 'engine_log', path: '/p/phalanx-a.log', lines })).toBe(true);
    expect(model.engineLog?.lines).toEqual(lines);
    expect(changes).toEqual(['cluster']);
    model.apply(snapshot([cluster(2)])); // the same kernel, attached again
    expect(model.engineLog?.path).toBe('/p/phalanx-a.log');
    model.clear(); // restarted
    expect(model.engineLog).toBeNull();
  });

  it('clears on restart and reports connection changes once', () => {
    const { model, changes } = modelWithLog();
    model.apply(cluster(2));
    model.setConnection('attached');
    model.setConnection('attached');
    model.clear();
    expect(model.cluster).toBeNull();
    expect(changes.filter(c => c === 'connection')).toHaveLength(1);
  });

  it('does not signal metrics when every row was a repeat', () => {
    const { model, changes } = modelWithLog();
    model.apply(metrics('r', [row(0, 1, 1)]));
    changes.length = 0;
    model.apply(metrics('r', [row(0, 1, 1)]));
    expect(changes).toEqual([]);
  });

  it('keeps the window the kernel answered a zoomed chart with, for the current run only', () => {
    const { model, changes } = modelWithLog();
    model.apply(started('r1'));
    const rows = Array.from({ length: 300 }, (_, i) => row(i % 2, 100 + (i >> 1), i, i));
    expect(
      model.receive({
        v: 1,
        type: 'history_window',
        run: 'r1',
        start: 100,
        end: 249,
        rows,
        means: {
          loss: Array.from({ length: 150 }, (_, i): [number, number] => [100 + i, 2 * i + 0.5])
        }
      })
    ).toBe(true);
    const window = model.run!.window!;
    expect([window.start, window.end]).toEqual([100, 249]);
    expect(window.history.series('loss').get(1)?.steps).toHaveLength(150); // every row
    expect(window.history.mean('loss')?.steps).toHaveLength(150);
    expect(model.run!.history.rowCount).toBe(0); // the run's curves are not touched
    expect(changes[changes.length - 1]).toBe('metrics');
    model.apply({ v: 1, type: 'history_window', run: 'old', start: 0, end: 1, rows: [] });
    expect(model.run!.window).toBe(window);
  });
});
