/**
 * Keeps one kernel's `phalanx` comm open and feeds its messages into a model.
 *
 * The kernel side exists only after `%load_ext phalanx`, so attaching is a
 * loop, not a call: try at once (a reloaded page finds it there), try again
 * when the kernel says the target appeared (it opens a short-lived comm to us
 * on load), and as a fallback when the kernel goes idle, with backoff so an
 * unloaded kernel is not asked after every cell. A restart clears the model.
 *
 * The comm goes over a kernel subshell where the kernel has them, so a panel
 * opened (or reloaded) while a cell runs attaches at once instead of waiting
 * for the cell.
 */
import type { Kernel, KernelMessage } from '@jupyterlab/services';
import { IDisposable } from '@lumino/disposable';

import { PhalanxModel } from './model';
import { COMM_TARGET, PhalanxRequest, Requests, validateRequest } from './protocol';
import { PanelSubshell } from './subshell';

export interface IKernelLinkOptions {
  kernel: Kernel.IKernelConnection;
  model: PhalanxModel;
  /** Clock in ms (a seam for tests). */
  now?: () => number;
}

/** Wait this long after the n-th failed attempt before the idle fallback tries again. */
export function retryDelayMs(failures: number): number {
  return failures === 0 ? 0 : Math.min(1000 * 2 ** (failures - 1), 30_000);
}

const GONE: ReadonlySet<KernelMessage.Status> = new Set([
  'restarting',
  'autorestarting',
  'terminating',
  'dead'
]);

export class KernelLink implements IDisposable {
  constructor(options: IKernelLinkOptions) {
    this.kernel = options.kernel;
    this.model = options.model;
    // Connections that cannot say whether the kernel has subshells (tests' fakes) use the
    // main shell.
    this._subshell = 'sendControlMessage' in this.kernel ? new PanelSubshell(this.kernel) : null;
    this._now = options.now ?? Date.now;
    this.kernel.registerCommTarget(COMM_TARGET, this._onAnnounce);
    this.kernel.statusChanged.connect(this._onStatus, this);
    this.model.setConnection('waiting');
    this.attach();
  }

  readonly kernel: Kernel.IKernelConnection;
  readonly model: PhalanxModel;

  get isDisposed(): boolean {
    return this._disposed;
  }

  get attached(): boolean {
    return this._comm !== null && this._live;
  }

  /** Open the comm unless one is open or being opened. */
  attach(): void {
    if (this._disposed || this._comm || GONE.has(this.kernel.status)) {
      return;
    }
    let comm: Kernel.IComm;
    try {
      comm = this.kernel.createComm(COMM_TARGET);
    } catch (err) {
      // A connection that does not handle comms (handleComms = false) cannot host us.
      console.warn('phalanx: cannot open a comm on this kernel connection', err);
      return;
    }
    this._comm = comm;
    this._live = false;
    this._lastAttempt = this._now();
    this._announced = false;
    comm.onMsg = msg => this._onMessage(comm, msg);
    comm.onClose = () => this._onClosed(comm);
    this._subshellId = null;
    const subshell = this._subshell;
    if (!subshell) {
      comm.open(Requests.snapshot());
      return;
    }
    void subshell.id().then(id => {
      if (comm !== this._comm || comm.isDisposed || this.kernel.isDisposed) {
        return;
      }
      this._subshellId = id;
      if (id) {
        const content = { comm_id: comm.commId, target_name: COMM_TARGET };
        subshell.send(id, 'comm_open', { ...content, data: Requests.snapshot() });
      } else {
        comm.open(Requests.snapshot());
      }
    });
  }

  /** The subshell the comm speaks on (null: the main shell, or not known yet). */
  get subshellId(): string | null {
    return this._subshellId;
  }

  /** Send a typed request; returns false when not attached. */
  send(request: PhalanxRequest): boolean {
    if (!this.attached || !this._comm) {
      return false;
    }
    const data = validateRequest(request);
    if (this._subshell && this._subshellId) {
      this._subshell.send(this._subshellId, 'comm_msg', { comm_id: this._comm.commId, data });
    } else {
      this._comm.send(data);
    }
    return true;
  }

  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    this.kernel.removeCommTarget(COMM_TARGET, this._onAnnounce);
    this.kernel.statusChanged.disconnect(this._onStatus, this);
    this._subshell?.dispose();
    const comm = this._comm;
    this._comm = null;
    if (comm && !comm.isDisposed && !this.kernel.isDisposed) {
      // Tell the kernel, or it keeps sending to a panel that is gone.
      comm.close();
    }
  }

  private _onMessage(comm: Kernel.IComm, msg: KernelMessage.ICommMsgMsg): void {
    if (comm !== this._comm) {
      return;
    }
    if (this.model.receive(msg.content.data) && !this._live) {
      this._live = true;
      this._failures = 0;
      this.model.setConnection('attached');
    }
  }

  private _onClosed(comm: Kernel.IComm): void {
    if (comm !== this._comm) {
      return;
    }
    this._comm = null;
    if (this._live) {
      // The kernel let go of us (unloaded, or replaced by newer panels).
      this._live = false;
      this.model.clear();
    } else {
      this._failures += 1; // refused: no comm target yet
    }
    this.model.setConnection('waiting');
    if (this._announced) {
      // The target appeared while this attempt was in flight: try again now.
      this._announced = false;
      this.attach();
    }
  }

  private _onStatus(_: Kernel.IKernelConnection, status: KernelMessage.Status): void {
    if (GONE.has(status)) {
      this._drop();
      return;
    }
    if (status === 'idle' && !this._comm) {
      // After a cell: maybe it was `%load_ext phalanx` and the announcement was missed.
      if (this._now() - this._lastAttempt >= retryDelayMs(this._failures)) {
        this.attach();
      }
    }
  }

  private _drop(): void {
    this._subshell?.reset(); // a restarted kernel has none of its subshells
    const comm = this._comm;
    this._comm = null;
    this._live = false;
    this._failures = 0; // a new kernel process: whatever failed before may work now
    this._lastAttempt = -Infinity;
    comm?.dispose(); // the kernel is gone: nothing to tell it
    this.model.clear();
    this.model.setConnection('waiting');
  }

  private _onAnnounce = (): void => {
    // The kernel just registered the target; it closes this comm itself.
    this._failures = 0;
    this._announced = this._comm !== null && !this._live;
    this.attach();
  };

  private _comm: Kernel.IComm | null = null;
  private _subshell: PanelSubshell | null;
  private _subshellId: string | null = null;
  private _live = false;
  private _announced = false;
  private _failures = 0;
  private _lastAttempt = -Infinity;
  private _disposed = false;
  private _now: () => number;
}
