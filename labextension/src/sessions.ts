/**
 * One model and one comm link per kernel connection, so each notebook keeps
 * its own kernel's state and switching notebooks shows it at once.
 */
import type { Kernel } from '@jupyterlab/services';
import { IDisposable } from '@lumino/disposable';

import { KernelLink } from './link';
import { PhalanxModel } from './model';
import { PhalanxRequest, Requests } from './protocol';

/** What the panel shows and talks to for one kernel. */
export interface IKernelSession {
  readonly model: PhalanxModel;
  /** Send a typed request to the kernel; false when phalanx is not attached. */
  send(request: PhalanxRequest): boolean;
  /** Ask for a fresh snapshot (or try attaching again). */
  refresh(): void;
}

class KernelSession implements IKernelSession {
  constructor(kernel: Kernel.IKernelConnection) {
    this.model = new PhalanxModel();
    this.link = new KernelLink({ kernel, model: this.model });
  }

  readonly model: PhalanxModel;
  readonly link: KernelLink;

  send(request: PhalanxRequest): boolean {
    return this.link.send(request);
  }

  refresh(): void {
    if (!this.link.send(Requests.snapshot())) {
      this.link.attach();
    }
  }
}

export class KernelSessions implements IDisposable {
  get isDisposed(): boolean {
    return this._disposed;
  }

  /** The session of `kernel`, created on first use and dropped with the kernel. */
  get(kernel: Kernel.IKernelConnection): IKernelSession {
    let session = this._sessions.get(kernel);
    if (!session) {
      session = new KernelSession(kernel);
      this._sessions.set(kernel, session);
      kernel.disposed.connect(this._onKernelDisposed, this);
    }
    return session;
  }

  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    for (const [kernel, session] of this._sessions) {
      kernel.disposed.disconnect(this._onKernelDisposed, this);
      session.link.dispose();
    }
    this._sessions.clear();
  }

  private _onKernelDisposed(kernel: Kernel.IKernelConnection): void {
    this._sessions.get(kernel)?.link.dispose();
    this._sessions.delete(kernel);
  }

  private _sessions = new Map<Kernel.IKernelConnection, KernelSession>();
  private _disposed = false;
}
