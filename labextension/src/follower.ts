/**
 * Tells the panel which kernel to show: the one of the notebook last
 * focused (INotebookTracker's current widget), following kernel changes.
 */
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { IDisposable } from '@lumino/disposable';
import { ISignal, Signal } from '@lumino/signaling';

import { IKernelSession, KernelSessions } from './sessions';

export interface IFollowed {
  readonly session: IKernelSession;
  /** The notebook's name, for the panel header. */
  readonly label: string;
}

export class ActiveKernelFollower implements IDisposable {
  constructor(
    private readonly _tracker: INotebookTracker,
    private readonly _sessions: KernelSessions
  ) {
    _tracker.forEach(nb => this._watch(nb));
    _tracker.widgetAdded.connect((_, nb) => this._watch(nb), this);
    _tracker.currentChanged.connect(this._update, this);
    this._update();
  }

  /** Emitted when the followed kernel (or notebook) changes. */
  get changed(): ISignal<this, IFollowed | null> {
    return this._changed;
  }

  get current(): IFollowed | null {
    return this._current;
  }

  get isDisposed(): boolean {
    return this._disposed;
  }

  dispose(): void {
    this._disposed = true;
    Signal.clearData(this);
  }

  private _watch(nb: NotebookPanel): void {
    // Every notebook gets its session eagerly: the kernel's "target is
    // loaded" announcement must find a listener even while it is not shown.
    const onKernel = (): void => {
      this._ensure(nb);
      if (nb === this._tracker.currentWidget) {
        this._update();
      }
    };
    nb.sessionContext.kernelChanged.connect(onKernel, this);
    nb.title.changed.connect(onKernel, this);
    this._ensure(nb);
  }

  private _ensure(nb: NotebookPanel): IKernelSession | null {
    const kernel = nb.sessionContext.session?.kernel;
    return kernel ? this._sessions.get(kernel) : null;
  }

  private _update(): void {
    if (this._disposed) {
      return;
    }
    const nb = this._tracker.currentWidget;
    const session = nb ? this._ensure(nb) : null;
    const next = nb && session ? { session, label: nb.title.label } : null;
    if (next?.session !== this._current?.session || next?.label !== this._current?.label) {
      this._current = next;
      this._changed.emit(next);
    }
  }

  private _changed = new Signal<this, IFollowed | null>(this);
  private _current: IFollowed | null = null;
  private _disposed = false;
}
