/**
 * Run section: the kernel's runs (when there is more than one), then the
 * shown run's progress bar per rank (steps, rate, ETA, straggler mark, step
 * parts) and the loss chart over its whole history with a metric selector
 * and a log-scale toggle.
 */
import * as fmt from '../format';
import { IRankState, IRunState, PhalanxModel } from '../model';
import { LossChart, rankColor } from './chart';
import { h, ISection, replaceChildren, section, showEmpty } from './dom';
import { partsBar } from './parts';
import { RunListView } from './runs';

export interface IRunActions {
  /** Stop the running run (its cell says it was stopped; the engines stay). */
  stop(): void;
  /** Ask the kernel for `run`'s rows in a step window (a zoomed chart). */
  window?(run: string, start: number, end: number): void;
  /** Record the next run's first steps on every rank with torch.profiler (--profile). */
  profileNext?(): void;
  /** Show run `id` of the run list (null: follow the newest). */
  pick?(id: string | null): void;
}

export class RunView {
  constructor(private readonly _actions: IRunActions = { stop: () => undefined }) {
    this._section = section('Run', 'jp-Phalanx-run');
    this._stop = h(
      'button',
      {
        class: 'jp-Phalanx-button jp-Phalanx-stopRun',
        title: 'Stop this run: every rank stops, the engines stay up',
        'aria-label': 'stop run'
      },
      'Stop run'
    );
    this._stop.onclick = () => this.requestStop();
    this._profile = h(
      'button',
      {
        class: 'jp-Phalanx-button jp-Phalanx-profileNext',
        title: 'Profile the next run: its first 5 steps on every rank, merged into one trace',
        'aria-label': 'profile next run'
      },
      'Profile next run'
    );
    this._profile.onclick = () => {
      this._profileAfter = this._latest;
      this._actions.profileNext?.();
      this._showProfile();
    };
    this._ranks = h('div', { class: 'jp-Phalanx-ranks' });
    this._metric = h('select', { class: 'jp-Phalanx-metric', 'aria-label': 'metric' });
    this._log = h('input', {
      type: 'checkbox',
      class: 'jp-Phalanx-log',
      'aria-label': 'log scale'
    });
    this._metric.onchange = () => this._drawChart(true);
    this._log.onchange = () => this._drawChart(true);
    this._chart = new LossChart((start, end) => {
      if (this._run) {
        this._actions.window?.(this._run.id, start, end);
      }
    });
    this._chartEmpty = h(
      'div',
      { class: 'jp-Phalanx-empty' },
      'No metrics logged yet: call phalanx.log(loss=...) in the loop.'
    );
    this._error = h('div', { class: 'jp-Phalanx-error jp-Phalanx-runError', role: 'alert' });
    this._runs = new RunListView({ pick: id => this._actions.pick?.(id) });
    this._section.body.append(
      this._runs.node,
      h('div', { class: 'jp-Phalanx-runControls' }, this._stop, this._profile),
      this._ranks,
      this._error,
      h(
        'div',
        { class: 'jp-Phalanx-chartControls' },
        h('label', {}, 'metric ', this._metric),
        h('label', {}, this._log, ' log scale')
      ),
      this._chartEmpty,
      this._chart.node
    );
  }

  get node(): HTMLElement {
    return this._section.node;
  }

  /**
   * Stop the kernel's running run, as the Stop run button does (the palette's
   * Stop Run comes here too); the button says it is stopping while it shows that run.
   */
  requestStop(): void {
    this._stopping = this._running;
    if (this._run !== null && this._run.id === this._running) {
      this._stop.disabled = true;
      this._stop.textContent = 'stopping…';
    }
    this._actions.stop();
  }

  update(model: PhalanxModel | null): void {
    const run = model?.connection === 'attached' ? model.run : null;
    this._run = run;
    const latest = model?.connection === 'attached' ? model.latestRun : null;
    this._latest = latest?.id ?? null;
    this._running = latest?.status === 'running' ? this._latest : null;
    this._runs.update(model);
    this._showStop(run);
    this._showProfile();
    if (!run) {
      this._section.summary.textContent = '';
      this._section.summary.title = '';
      delete this._section.node.dataset.status;
      delete this._section.node.dataset.run;
      delete this._section.node.dataset.loaded;
      showEmpty(this._section, emptyMessage(model));
      this._chart.clear();
      return;
    }
    showEmpty(this._section, null);
    // The id is opaque ("9c2bf0ff5-1"): show the name when the kernel sent one, the id on hover.
    const parts: string[] = run.name ? [run.name, run.status] : [run.status];
    if (run.strategy) {
      parts.push(run.strategy);
    }
    if (run.worldSize !== null) {
      parts.push(`${run.worldSize} rank${run.worldSize === 1 ? '' : 's'}`);
    }
    if (run.wallS !== null) {
      parts.push(fmt.wallTime(run.wallS)); // run_ended's figure, as the cell says it
    }
    if (!run.loaded) {
      parts.push('loading…');
    }
    // No-break spaces: a narrow sidebar wraps between parts, never inside "2 ranks".
    this._section.summary.textContent = parts.map(p => p.replace(/ /g, '\u00a0')).join(' · ');
    this._section.summary.title = `run ${run.id}`;
    this._section.node.dataset.status = run.status;
    this._section.node.dataset.run = run.id;
    this._section.node.dataset.loaded = String(run.loaded);
    this._error.textContent = run.error ?? '';
    this._error.hidden = !run.error;
    const ranks = [...run.ranks.values()].sort((a, b) => a.rank - b.rank);
    replaceChildren(this._ranks, ...ranks.map(r => rankRow(r, run)));
    this._drawChart(false);
  }

  dispose(): void {
    this._chart.dispose();
  }

  private _showStop(run: IRunState | null): void {
    const running = run?.status === 'running';
    this._stop.hidden = !running;
    if (!running || this._stopping !== run?.id) {
      this._stopping = null;
      this._stop.disabled = false;
      this._stop.textContent = 'Stop run';
    }
  }

  /** Armed from the click until a newer run starts (that run is the profiled one). */
  private _showProfile(): void {
    if (this._profileAfter !== undefined && this._latest !== this._profileAfter) {
      this._profileAfter = undefined;
    }
    const armed = this._profileAfter !== undefined;
    this._profile.disabled = armed;
    this._profile.textContent = armed ? 'next run: profiled' : 'Profile next run';
  }

  private _drawChart(userChanged: boolean): void {
    const run = this._run;
    if (!run) {
      return;
    }
    const names = run.history.metricNames;
    this._syncMetricOptions(names);
    const metric = this._metric.value;
    const hasData = metric !== '' && run.history.series(metric).size > 0;
    this._chartEmpty.hidden = hasData;
    this._chart.node.hidden = !hasData;
    if (hasData) {
      if (userChanged) {
        this._chart.clear();
      }
      this._chart.draw(run.history, metric, this._log.checked, run.window);
      this._chart.node.dataset.points = String(this._chart.points);
    }
  }

  private _syncMetricOptions(names: string[]): void {
    if (names.join('\n') === this._names.join('\n')) {
      return;
    }
    const previous = this._metric.value;
    this._names = names;
    replaceChildren(this._metric, ...names.map(n => h('option', { value: n }, n)));
    // Keep the user's choice; default to a loss when there is one.
    const preferred = names.includes(previous)
      ? previous
      : (names.find(n => /loss/i.test(n)) ?? names[0]);
    this._metric.value = preferred ?? '';
  }

  private _section: ISection;
  private _runs: RunListView;
  private _stop: HTMLButtonElement;
  private _stopping: string | null = null;
  /** The kernel's newest run and, while it runs, its id again, whichever run is shown. */
  private _latest: string | null = null;
  private _running: string | null = null;
  private _profile: HTMLButtonElement;
  /** The newest run when Profile was clicked (undefined: not armed). */
  private _profileAfter: string | null | undefined = undefined;
  private _ranks: HTMLElement;
  private _metric: HTMLSelectElement;
  private _log: HTMLInputElement;
  private _chart: LossChart;
  private _chartEmpty: HTMLElement;
  private _error: HTMLElement;
  private _names: string[] = [];
  private _run: IRunState | null = null;
}

function rankRow(r: IRankState, run: IRunState): HTMLElement {
  const total = r.total ?? run.totalSteps;
  const fraction = total ? Math.min(1, r.step / total) : null;
  const done = run.status === 'done' || (total !== null && r.step >= total);
  const fill = h('div', {
    class: 'jp-Phalanx-barFill',
    style: `width: ${fraction === null ? 100 : Math.round(fraction * 100)}%; background: ${rankColor(r.rank)}`
  });
  const bar = h(
    'div',
    {
      class: `jp-Phalanx-bar${fraction === null ? ' jp-mod-indeterminate' : ''}`,
      role: 'progressbar',
      'aria-valuemin': '0',
      'aria-valuenow': String(r.step),
      ...(total ? { 'aria-valuemax': String(total) } : {})
    },
    fill
  );
  const count = total ? `${r.step}/${total}` : `${r.step} steps`;
  const eta = done ? 'done' : `ETA ${fmt.duration(r.etaS)}`;
  return h(
    'div',
    {
      class: `jp-Phalanx-rank${r.straggler ? ' jp-mod-straggler' : ''}${done ? ' jp-mod-done' : ''}`,
      'data-rank': String(r.rank),
      'data-step': String(r.step)
    },
    h('span', { class: 'jp-Phalanx-rankLabel' }, `rank ${r.rank}`),
    bar,
    h('span', { class: 'jp-Phalanx-rankStats' }, `${count} · ${fmt.rate(r.stepsPerS)} · ${eta}`),
    r.straggler
      ? h(
          'span',
          { class: 'jp-Phalanx-straggler', title: 'more than 20% behind the median rank' },
          'straggler'
        )
      : null,
    partsBar(run.times.get(r.rank))
  );
}

function emptyMessage(model: PhalanxModel | null): Node | string {
  if (!model || model.connection !== 'attached') {
    return 'No run.';
  }
  return h('span', {}, 'No run yet. Train with a ', h('code', {}, '%%distributed_fit'), ' cell.');
}
