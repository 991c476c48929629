/**
 * The kernel's runs, newest first: name, status and wall time of each. The
 * panel follows the newest run until the person picks one; a picked run
 * stays shown when newer runs start (a validation run after a training run),
 * until "follow latest".
 */
import * as fmt from '../format';
import { IRunSummary, PhalanxModel } from '../model';
import { h, replaceChildren } from './dom';

export interface IRunListActions {
  /** Show run `id` (null: follow the newest run again). */
  pick(id: string | null): void;
}

/** A run list is worth its space from the second run on. */
const MIN_LISTED = 2;

export class RunListView {
  constructor(private readonly _actions: IRunListActions) {
    this._follow = h(
      'button',
      {
        class: 'jp-Phalanx-button jp-Phalanx-followLatest',
        title: 'Show the newest run, and each new run as it starts'
      },
      'follow latest'
    );
    this._follow.onclick = () => this._actions.pick(null);
    this._mode = h('span', { class: 'jp-Phalanx-runsMode' });
    this._list = h('ul', { class: 'jp-Phalanx-runList', 'aria-label': 'runs' });
    this.node = h(
      'div',
      { class: 'jp-Phalanx-runs' },
      h('div', { class: 'jp-Phalanx-runsHeader' }, this._mode, this._follow),
      this._list
    );
  }

  readonly node: HTMLElement;

  update(model: PhalanxModel | null): void {
    const runs = model?.connection === 'attached' ? model.runs : [];
    this.node.hidden = runs.length < MIN_LISTED;
    if (this.node.hidden || !model) {
      return;
    }
    const shown = model.run?.id ?? null;
    const picked = model.picked;
    this.node.dataset.picked = picked ?? '';
    this._mode.textContent = picked === null ? 'following the latest run' : 'picked run';
    this._follow.hidden = picked === null;
    const key = JSON.stringify([shown, runs]);
    if (key === this._key) {
      return; // nothing changed: keep the buttons (and the focus on one)
    }
    this._key = key;
    replaceChildren(
      this._list,
      ...[...runs].reverse().map(run => h('li', {}, this._item(run, run.id === shown)))
    );
  }

  private _item(run: IRunSummary, shown: boolean): HTMLButtonElement {
    const name = run.name ?? run.id;
    const time = run.wallS === null ? '' : fmt.wallTime(run.wallS);
    const item = h(
      'button',
      {
        class: `jp-Phalanx-runItem${shown ? ' jp-mod-current' : ''}`,
        'data-run': run.id,
        'data-status': run.status,
        'aria-pressed': String(shown),
        title: [`run ${run.id}`, run.error].filter(Boolean).join('\n')
      },
      h('span', { class: 'jp-Phalanx-runName' }, name),
      h('span', { class: `jp-Phalanx-runStatus jp-Phalanx-run-${run.status}` }, run.status),
      h('span', { class: 'jp-Phalanx-runTime' }, time)
    );
    item.onclick = () => this._actions.pick(run.id);
    return item;
  }

  private _follow: HTMLButtonElement;
  private _mode: HTMLElement;
  private _list: HTMLElement;
  private _key = '';
}
