/**
 * The right-sidebar widget. It shows whichever kernel session it is told to
 * follow and redraws at most ~10 times a second however fast events come.
 */
import { LabIcon } from '@jupyterlab/ui-components';
import { SplitPanel, Widget } from '@lumino/widgets';

import { ChangeKind, PhalanxModel } from '../model';
import { PhalanxRequest, Requests } from '../protocol';
import { IFollowed } from '../follower';
import { Throttle } from '../throttle';
import { ClusterView } from './cluster';
import { h, replaceChildren } from './dom';
import { NetworkView } from './network';
import { RunView } from './run';

export const PANEL_ID = 'phalanx';
/**
 * The sidebar width the panel first opens at: room for the engine table and a
 * chart with several ticks. JupyterLab opens side areas at about a fifth of the
 * window (some 300 px on a laptop); the panel holds down to JupyterLab's
 * narrowest sidebar (250 px) too.
 */
export const DEFAULT_WIDTH_PX = 400;
/** Set once the panel has widened its sidebar in this browser: then the person's width wins. */
const WIDENED_KEY = 'phalanx:sidebar-widened';
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
      stop: () => this._send(Requests.stop()),
      log: () => this._send(Requests.log())
    });
    this._run = new RunView({
      stop: () => this._send(Requests.stopRun()),
      window: (run, start, end) => this._send(Requests.window(run, start, end, WINDOW_POINTS)),
      profileNext: () => this._send(Requests.profileNext()),
      pick: id => this._model?.pick(id)
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

  /** Whether the followed kernel has a run going (what Stop Run acts on). */
  get canStopRun(): boolean {
    return this._model?.connection === 'attached' && this._model.latestRun?.status === 'running';
  }

  /** The cluster as the scale controls see it (null: nothing to scale). */
  get scaling(): { engines: number; max: number; locked: boolean } | null {
    this._renderNow();
    return this._model?.connection === 'attached' ? this._cluster.scaling : null;
  }

  /** Stop the followed kernel's run: what the Run section's Stop run does. */
  stopRun(): void {
    this._renderNow();
    this._run.requestStop();
  }

  /** Scale the followed kernel's cluster to `n` engines: what the count box does. */
  scaleTo(n: number): void {
    this._renderNow();
    this._cluster.scaleTo(n);
  }

  /** One engine more or fewer: what + and − do. */
  scaleBy(delta: number): void {
    this._renderNow();
    this._cluster.scaleBy(delta);
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
    if (!this._widened) {
      this._widened = true;
      if (firstTimeHere()) {
        requestAnimationFrame(() => widenSidebar(this, DEFAULT_WIDTH_PX));
      }
    }
  }

  /**
   * The views act on what they last drew; a hidden panel draws nothing, so a
   * command brings them up to date first.
   */
  private _renderNow(): void {
    if (this._dirty.size > 0) {
      this._render();
    }
  }

  private _render(): void {
    const model = this._model;
    const dirty = this._dirty;
    this._dirty = new Set();
    const connection = model?.connection ?? 'no-kernel';
    this._kernelLabel.textContent = this._target?.label ?? '';
    this._kernelLabel.title = this._target ? `following the kernel of ${this._target.label}` : '';
    // A kernel in the middle of a run is busy, not absent: say what runs (whichever run is shown).
    const latest = model?.latestRun ?? null;
    const running = connection === 'attached' && latest?.status === 'running';
    this._status.textContent = running
      ? `busy · ${latest?.name ?? 'a run'}`
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
    // A picked earlier run the panel does not hold: ask the kernel for its record.
    const wanted = connection === 'attached' ? model?.takeWantedRecord() : null;
    if (wanted) {
      this._send(Requests.run(wanted));
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
  private _widened = false;
}

/** Whether this browser has never widened the panel's sidebar (noted now). */
function firstTimeHere(): boolean {
  try {
    if (window.localStorage.getItem(WIDENED_KEY) !== null) {
      return false;
    }
    window.localStorage.setItem(WIDENED_KEY, '1');
  } catch {
    // No storage (a locked-down browser): widen at each page load instead.
  }
  return true;
}

/**
 * Give the side area holding `widget` `width` pixels, taken from the largest
 * other area (the documents), the way JupyterLab sizes its areas: relative
 * sizes of the shell's split panel, which JupyterLab then keeps in the
 * workspace. The documents keep at least half the room they had.
 */
export function widenSidebar(widget: Widget, width: number): void {
  let area: Widget = widget;
  let split = widget.parent;
  while (split && !(split instanceof SplitPanel)) {
    area = split;
    split = split.parent;
  }
  const index = split ? split.widgets.indexOf(area) : -1;
  if (!split || index < 0) {
    return;
  }
  const total = split.node.clientWidth;
  const px = split.relativeSizes().map(r => r * total);
  let main = -1;
  px.forEach((size, i) => {
    if (i !== index && (main < 0 || size > px[main])) {
      main = i;
    }
  });
  const give = main < 0 ? 0 : Math.min(width - px[index], px[main] / 2);
  if (give > 1) {
    px[index] += give;
    px[main] -= give;
    split.setRelativeSizes(px);
  }
}
