/**
 * Cluster section: the engines table and the scale/stop controls. The
 * controls are built once and only updated, so typing in the count box is
 * never interrupted by a live update.
 */
import * as fmt from '../format';
import { PhalanxModel } from '../model';
import { IClusterEvent } from '../protocol';
import { h, ISection, replaceChildren, section, showEmpty } from './dom';

export interface IClusterActions {
  scale(n: number): void;
  stop(): void;
}

const COLUMNS = ['rank', 'host', 'device', 'state', 'memory', 'step'];

export class ClusterView {
  constructor(private readonly _actions: IClusterActions) {
    this._section = section('Cluster', 'jp-Phalanx-cluster');
    this._minus = h(
      'button',
      { class: 'jp-Phalanx-button', title: 'One engine fewer', 'aria-label': 'scale down' },
      '−'
    );
    this._plus = h(
      'button',
      { class: 'jp-Phalanx-button', title: 'One engine more', 'aria-label': 'scale up' },
      '+'
    );
    this._count = h('input', {
      class: 'jp-Phalanx-count',
      type: 'number',
      min: '1',
      title: 'Engines wanted (Enter to scale)',
      'aria-label': 'engine count'
    });
    this._stop = h(
      'button',
      { class: 'jp-Phalanx-button jp-Phalanx-stop', title: 'Stop the cluster' },
      'Stop'
    );
    this._minus.onclick = () => this._scaleBy(-1);
    this._plus.onclick = () => this._scaleBy(+1);
    this._stop.onclick = () => this._actions.stop();
    this._count.onkeydown = event => {
      if (event.key === 'Enter') {
        this._scaleTo(Number(this._count.value));
      }
    };
    this._tbody = h('tbody');
    this._error = h('div', { class: 'jp-Phalanx-error', role: 'alert' });
    const head = h('tr', {}, ...COLUMNS.map(c => h('th', {}, c)));
    this._section.body.append(
      h(
        'div',
        { class: 'jp-Phalanx-tableWrap' },
        h('table', { class: 'jp-Phalanx-table' }, h('thead', {}, head), this._tbody)
      ),
      h('div', { class: 'jp-Phalanx-controls' }, this._minus, this._count, this._plus, this._stop),
      this._error
    );
  }

  get node(): HTMLElement {
    return this._section.node;
  }

  update(model: PhalanxModel | null): void {
    const cluster = model?.connection === 'attached' ? model.cluster : null;
    this._cluster = cluster;
    this._error.textContent = cluster?.error ?? '';
    this._error.hidden = !cluster?.error;
    if (!cluster || cluster.engines.length === 0) {
      this._section.summary.textContent = '';
      showEmpty(this._section, emptyMessage(model, cluster));
      return;
    }
    showEmpty(this._section, null);
    const n = cluster.engines.length;
    this._section.summary.textContent =
      `${n} engine${n === 1 ? '' : 's'} · ${cluster.launcher ?? 'local'} · max ${cluster.max_engines}` +
      (cluster.busy ? ' · changing…' : '');
    const rows = [...cluster.engines]
      .sort((a, b) => a.rank - b.rank)
      .map(e =>
        h(
          'tr',
          { 'data-rank': String(e.rank) },
          h('td', {}, String(e.rank)),
          h(
            'td',
            { class: 'jp-Phalanx-host', title: e.pid ? `${e.host}, pid ${e.pid}` : e.host },
            e.host
          ),
          h('td', {}, e.device ?? '–'),
          h(
            'td',
            {},
            h('span', { class: `jp-Phalanx-state jp-Phalanx-engine-${e.state}` }, e.state)
          ),
          h('td', {}, fmt.memory(e.memory_mb)),
          h('td', {}, e.step === null || e.step === undefined ? '–' : String(e.step))
        )
      );
    replaceChildren(this._tbody, ...rows);
    const locked = cluster.busy;
    this._minus.disabled = locked || n <= 1;
    this._plus.disabled = locked || n >= cluster.max_engines;
    this._stop.disabled = locked;
    this._count.disabled = locked;
    this._count.max = String(cluster.max_engines);
    if (document.activeElement !== this._count) {
      this._count.value = String(n);
    }
  }

  private _scaleBy(delta: number): void {
    if (this._cluster) {
      this._scaleTo(this._cluster.engines.length + delta);
    }
  }

  private _scaleTo(n: number): void {
    const cluster = this._cluster;
    if (!cluster) {
      return;
    }
    // Say why here rather than send what the kernel would refuse anyway.
    if (!Number.isInteger(n) || n < 1 || n > cluster.max_engines) {
      this._error.hidden = false;
      this._error.textContent = `Engine count must be a whole number from 1 to ${cluster.max_engines}.`;
      return;
    }
    if (n !== cluster.engines.length) {
      this._actions.scale(n);
    }
  }

  private _section: ISection;
  private _minus: HTMLButtonElement;
  private _plus: HTMLButtonElement;
  private _count: HTMLInputElement;
  private _stop: HTMLButtonElement;
  private _tbody: HTMLTableSectionElement;
  private _error: HTMLElement;
  private _cluster: IClusterEvent | null = null;
}

function emptyMessage(model: PhalanxModel | null, cluster: IClusterEvent | null): Node | string {
  if (!model || model.connection !== 'attached') {
    return 'No cluster.'; // the panel header says why
  }
  if (cluster?.busy) {
    return 'Starting the cluster…';
  }
  return h('span', {}, 'No cluster. Start one with ', h('code', {}, '%cluster start -n 2'), '.');
}
