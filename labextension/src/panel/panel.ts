/**
 * The right-sidebar widget. It shows whichever kernel session it is told to
 * follow and redraws at most ~10 times a second however fast events come.
 */
import { LabIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';

import { ChangeKind, PhalanxModel } from '../model';
import { PhalanxRequest, Requests } from '../protocol';
import { IFollowed } from '../follower';
import { Throttle } from '../throttle';
import { ClusterView } from './cluster';
import { h, replaceChildren } from './dom';
import { NetworkView } from './network';
import { RunView } from './run';

export const PANEL_ID = 'phalanx';
/** A zoomed chart gets its window at full resolution up to this many points per line. */
const WINDOW_POINTS = 20_000;

const ICON_SVG = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 16 16">
  <g class="jp-icon3" fill="#616161">
    <rect x="1" y="9" width="3" height="6" rx="0.5"/><rect x="6.5" y="5" width="3" height="10" rx="0.5"/>
    <rect x="12" y="1" width="3" height="14" rx="0.5"/>
  </g></svg>`;

export const phalanxIcon = new LabIcon({ name: 'phalanx:panel', svgstr: ICON_SVG });

const STATUS_TEXT: Record<string, string> = {
  'no-kernel': 'no kernel',
  waiting: 'phalanx not loaded',
  attached: 'live'
};

const HINTS: Record<string, () => Node | string> = {
  'no-kernel': () => 'Open a notebook to see its cluster, runs and learning networks.',
  waiting: () =>
    h(
      'span',
      {},
      'phalanx is not loaded in this kernel: run ',
      h('code', {}, '%load_ext phalanx'),
      ' in the notebook.'
    ),
  attached: () => ''
};

export class PhalanxPanel extends Widget {
  constructor() {
    super();
    this.id = PANEL_ID;
    this.title.icon = phalanxIcon;
    this.title.caption = 'phalanx';
    this.addClass('jp-PhalanxPanel');
    this._cluster = new ClusterView({
      scale: n => this._send(Requests.scale(n)),
      stop: () => this._send(Requests.stop())
    });
    this._run = new RunView({
      stop: () => this._send(Requests.stopRun()),
      window: (run, start, end) => this._send(Requests.window(run, start, end, WINDOW_POINTS)),
      profileNext: () => this._send(Requests.profileNext())
    });
    this._network = new NetworkView();
    this._kernelLabel = h('div', { class: 'jp-Phalanx-kernel' });
    this._status = h('span', { class: 'jp-Phalanx-status' });
    this._hint = h('div', { class: 'jp-Phalanx-hint' });
    this.node.append(
      h(
        'header',
        { class: 'jp-Phalanx-header' },
        h('div', { class: 'jp-Phalanx-titleRow' }, h('h2', {}, 'phalanx'), this._status),
        this._kernelLabel,
        this._hint
      ),
      this._cluster.node,
      this._run.node,
      this._network.node
    );
    this._throttle = new Throttle(() => this._render());
    this._render();
  }

  /** Show `target` (or the empty states when null). */
  follow(target: IFollowed | null): void {
    const model = target?.session.model ?? null;
    if (this._model !== model) {
      this._model?.changed.disconnect(this._onChange, this);
      model?.changed.connect(this._onChange, this);
      this._model = model;
    }
    this._target = target;
    this._dirty = new Set(['connection', 'cluster', 'run', 'metrics', 'network']);
    this._throttle.schedule();
  }

  /** Ask the followed kernel for a fresh snapshot. */
  refresh(): void {
    this._target?.session.refresh();
  }

  override dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._throttle.dispose();
    this._model?.changed.disconnect(this._onChange, this);
    this._run.dispose();
    super.dispose();
  }

  private _send(request: PhalanxRequest): void {
    if (!this._target?.session.send(request)) {
      console.warn('phalanx: not attached to a kernel; request not sent', request);
    }
  }

  private _onChange(_: PhalanxModel, kind: ChangeKind): void {
    this._dirty.add(kind);
    // A hidden sidebar needs no frames; it catches up when shown (onAfterShow).
    if (this.isVisible) {
      this._throttle.schedule();
    }
  }

  protected override onAfterShow(): void {
    this._throttle.schedule();
  }

  private _render(): void {
    const model = this._model;
    const dirty = this._dirty;
    this._dirty = new Set();
    const connection = model?.connection ?? 'no-kernel';
    this._kernelLabel.textContent = this._target?.label ?? '';
    this._kernelLabel.title = this._target ? `following the kernel of ${this._target.label}` : '';
    // A kernel in the middle of a run is busy, not absent: say what runs.
    const running = connection === 'attached' && model?.run?.status === 'running';
    this._status.textContent = running
      ? `busy · ${model?.run?.name ?? 'a run'}`
      : STATUS_TEXT[connection];
    replaceChildren(this._hint, HINTS[connection]());
    this._hint.hidden = connection === 'attached';
    this._status.dataset.state = running ? 'busy' : connection;
    this.node.dataset.connection = connection;
    if (dirty.has('connection') || dirty.has('cluster') || dirty.has('run')) {
      // (a run's live memory samples fill the cluster table's memory columns)
      this._cluster.update(model);
    }
    if (dirty.has('connection') || dirty.has('run') || dirty.has('metrics')) {
      // (the header's status line above follows the run too)
      this._run.update(model);
    }
    if (dirty.has('connection') || dirty.has('network')) {
      this._network.update(model);
    }
  }

  private _cluster: ClusterView;
  private _run: RunView;
  private _network: NetworkView;
  private _kernelLabel: HTMLElement;
  private _status: HTMLElement;
  private _hint: HTMLElement;
  private _throttle: Throttle;
  private _model: PhalanxModel | null = null;
  private _target: IFollowed | null = null;
  private _dirty = new Set<ChangeKind>(['connection', 'cluster', 'run', 'metrics', 'network']);
}
