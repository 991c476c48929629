/**
 * Cluster section: the engines table and the scale/stop controls. The
 * controls are built once and only updated, so typing in the count box is
 * never interrupted by a live update. After +, − or Stop the section says
 * what it waits for until the kernel answers (starting engines takes a while).
 * Log shows the cluster log's last lines: what the engines and the controller
 * said that is not the user's (kept out of the cells and the terminal), asked
 * of the kernel each time it is opened.
 */
import {
  EngineColumn,
  engineColumns,
  PendingRequest,
  withLiveMemory,
  withRunState
} from '../engines';
import * as fmt from '../format';
import { PhalanxModel } from '../model';
import { IClusterEvent, IEngine, IEngineLogEvent } from '../protocol';
import { h, ISection, replaceChildren, section, showEmpty } from './dom';

export interface IClusterActions {
  scale(n: number): void;
  stop(): void;
  /** Ask the kernel for the cluster log's last lines (answered as an `engine_log` event). */
  log(): void;
}

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
    this._logButton = h(
      'button',
      {
        class: 'jp-Phalanx-button jp-Phalanx-engineLogButton',
        title: "The engines' own output (not your cells'): the cluster log's last 200 lines",
        'aria-pressed': 'false'
      },
      'Log'
    );
    this._log = h('pre', { class: 'jp-Phalanx-engineLog', 'aria-label': 'engine log' });
    this._log.hidden = true;
    this._logButton.onclick = () => this.toggleLog();
    this._minus.onclick = () => this.scaleBy(-1);
    this._plus.onclick = () => this.scaleBy(+1);
    this._stop.onclick = () => {
      this._pending = new PendingRequest('stopping…', this._cluster);
      this._actions.stop();
      this._showControls();
    };
    this._count.onkeydown = event => {
      if (event.key === 'Enter') {
        this.scaleTo(Number(this._count.value));
      }
    };
    this._tbody = h('tbody');
    this._head = h('tr');
    this._error = h('div', { class: 'jp-Phalanx-error', role: 'alert' });
    this._notice = h('div', { class: 'jp-Phalanx-notice', role: 'status' });
    this._section.body.append(
      h(
        'div',
        { class: 'jp-Phalanx-tableWrap' },
        h('table', { class: 'jp-Phalanx-table' }, h('thead', {}, this._head), this._tbody)
      ),
      h(
        'div',
        { class: 'jp-Phalanx-controls' },
        this._minus,
        this._count,
        this._plus,
        this._stop,
        this._logButton
      ),
      this._notice,
      this._error,
      this._log
    );
  }

  get node(): HTMLElement {
    return this._section.node;
  }

  update(model: PhalanxModel | null): void {
    const cluster = model?.connection === 'attached' ? model.cluster : null;
    if (this._pending?.answeredBy(cluster) || !cluster) {
      this._pending = null;
    }
    this._cluster = cluster;
    this._showLog(model?.engineLog ?? null);
    this._error.textContent = cluster?.error ?? '';
    this._error.hidden = !cluster?.error;
    this._notice.textContent = cluster?.notice ?? '';
    this._notice.hidden = !cluster?.notice;
    if (!cluster || cluster.engines.length === 0) {
      this._section.summary.textContent = '';
      showEmpty(this._section, emptyMessage(model, cluster));
      return;
    }
    showEmpty(this._section, null);
    // The kernel's running run, whichever run the Run section shows: its ranks train.
    const latest = model?.latestRun ?? null;
    const live = latest?.status === 'running' ? latest.memory : null;
    const engines = withRunState(withLiveMemory(cluster.engines, live), latest).sort(
      (a, b) => a.rank - b.rank
    );
    const columns = engineColumns(engines);
    replaceChildren(this._head, ...columns.map(c => h('th', {}, c)));
    replaceChildren(
      this._tbody,
      ...engines.map(e =>
        h('tr', { 'data-rank': String(e.rank) }, ...columns.map(c => engineCell(e, c)))
      )
    );
    this._showControls();
  }

  /** Summary line and controls: locked while the kernel changes the cluster. */
  private _showControls(): void {
    const cluster = this._cluster;
    if (!cluster) {
      return;
    }
    const n = cluster.engines.length;
    const waiting = this._pending?.label ?? (cluster.busy ? 'changing…' : null);
    replaceChildren(
      this._section.summary,
      // No-break spaces: a narrow sidebar wraps between parts, never inside "max 64".
      `${n}\u00a0engine${n === 1 ? '' : 's'} · ${cluster.launcher ?? 'local'} · max\u00a0${cluster.max_engines}`,
      waiting && h('span', { class: 'jp-Phalanx-pending', role: 'status' }, waiting)
    );
    const locked = waiting !== null;
    this._minus.disabled = locked || n <= 1;
    this._plus.disabled = locked || n >= cluster.max_engines;
    this._stop.disabled = locked;
    this._count.disabled = locked;
    this._count.max = String(cluster.max_engines);
    if (document.activeElement !== this._count) {
      this._count.value = String(this._pending?.target ?? n);
    }
  }

  /** The engines now, and the most the cluster may have (null: no cluster to scale). */
  get scaling(): { engines: number; max: number; locked: boolean } | null {
    const cluster = this._cluster;
    if (!cluster || cluster.engines.length === 0) {
      return null;
    }
    const locked = this._pending !== null || cluster.busy;
    return { engines: cluster.engines.length, max: cluster.max_engines, locked };
  }

  /** Open the log (asking the kernel for its last lines), or close it. */
  toggleLog(): void {
    const open = this._log.hidden;
    this._log.hidden = !open;
    this._logButton.setAttribute('aria-pressed', String(open));
    if (open) {
      this._logAsked = true;
      this._log.textContent = 'reading the cluster log…';
      this._actions.log();
    }
  }

  private _showLog(answer: IEngineLogEvent | null): void {
    if (!answer || answer === this._logShown || !this._logAsked) {
      return;
    }
    this._logShown = answer;
    this._logAsked = false;
    this._log.title = answer.path ?? '';
    this._log.textContent =
      answer.lines.length > 0
        ? answer.lines.join('\n')
        : answer.path
          ? 'Nothing in the cluster log yet.'
          : 'No cluster has started in this kernel.';
    this._log.scrollTop = this._log.scrollHeight; // the newest lines
  }

  /** One engine more or fewer, as + and − do. */
  scaleBy(delta: number): void {
    if (this._cluster) {
      this.scaleTo(this._cluster.engines.length + delta);
    }
  }

  /** Scale to `n` engines, as the count box does: checked here, then asked of the kernel. */
  scaleTo(n: number): void {
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
      this._pending = new PendingRequest(`scaling to ${n}…`, cluster, n);
      this._actions.scale(n);
      this._showControls();
    }
  }

  private _section: ISection;
  private _minus: HTMLButtonElement;
  private _plus: HTMLButtonElement;
  private _count: HTMLInputElement;
  private _stop: HTMLButtonElement;
  private _logButton: HTMLButtonElement;
  private _log: HTMLPreElement;
  private _logAsked = false;
  private _logShown: IEngineLogEvent | null = null;
  private _head: HTMLTableRowElement;
  private _tbody: HTMLTableSectionElement;
  private _error: HTMLElement;
  private _notice: HTMLElement;
  private _cluster: IClusterEvent | null = null;
  private _pending: PendingRequest | null = null;
}

function engineCell(e: IEngine, column: EngineColumn): HTMLTableCellElement {
  switch (column) {
    case 'rank':
      return h('td', {}, String(e.rank));
    case 'host':
      return h(
        'td',
        { class: 'jp-Phalanx-host', title: e.pid ? `${e.host}, pid ${e.pid}` : e.host },
        e.host
      );
    case 'device':
      return h('td', {}, e.device ?? '–');
    case 'state':
      return h(
        'td',
        {},
        h('span', { class: `jp-Phalanx-state jp-Phalanx-engine-${e.state}` }, e.state)
      );
    case 'memory':
      return h(
        'td',
        { class: 'jp-Phalanx-rss', title: 'resident memory (RSS)' },
        fmt.memory(e.memory_mb)
      );
    case 'gpu memory':
      return h(
        'td',
        {
          class: 'jp-Phalanx-cuda',
          title: `CUDA allocated / reserved, peak ${fmt.memory(e.cuda_peak_mb)}`
        },
        `${fmt.memory(e.cuda_allocated_mb)} / ${fmt.memory(e.cuda_reserved_mb)}`
      );
    case 'step':
      return h('td', {}, e.step === null || e.step === undefined ? '–' : String(e.step));
  }
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
