/**
 * The panel's own kernel subshell (JEP 91): its comm is opened and spoken on
 * it, so the kernel answers on another thread while a cell runs on the main
 * shell.
 *
 * JupyterLab's comms can go over subshells by themselves, but only once the
 * connection has the kernel's info, which it asks for on the shell channel: a
 * page reloaded during a long cell gets no answer until the cell ends, and so
 * would the panel. The control channel is answered at once (ipykernel runs it
 * on its own thread), so this asks there whether the kernel has subshells,
 * creates one, and sends the panel's comm messages with its id. Kernels
 * without subshells (or that do not answer in time) are spoken to on the main
 * shell as before.
 *
 * A connection queues what is sent before its websocket is up, and sends the
 * queue only once the (shell) kernel info arrives or after its info timeout
 * (3 s), which after a reload during a run is what happens. So the panel sends
 * on a connection of its own (a clone that handles no comms: replies come back
 * to it, the comm's messages reach the notebook's connection on IOPub), which
 * has nothing queued ahead of the panel's requests.
 */
import { KernelMessage } from '@jupyterlab/services';
import type { Kernel } from '@jupyterlab/services';

/** How long to wait for the control channel before using the main shell. */
export const CONTROL_WAIT_MS = 10_000;

export function within<T>(promise: Promise<T>, ms: number, fallback: T): Promise<T> {
  return new Promise(resolve => {
    const timer = setTimeout(() => resolve(fallback), ms);
    promise.then(
      value => {
        clearTimeout(timer);
        resolve(value);
      },
      () => {
        clearTimeout(timer);
        resolve(fallback);
      }
    );
  });
}

type Content = Record<string, unknown>;

function message(
  kernel: Kernel.IKernelConnection,
  msgType: string,
  channel: 'shell' | 'control',
  content: Content,
  subshellId: string | null = null
): KernelMessage.IMessage {
  // One generic builder for several message types: createMessage's overloads are per type.
  const create = KernelMessage.createMessage as unknown as (options: {
    msgType: string;
    channel: string;
    session: string;
    username: string;
    subshellId: string | null;
    content: Content;
  }) => KernelMessage.IMessage;
  return create({
    msgType,
    channel,
    session: kernel.clientId,
    username: kernel.username,
    subshellId,
    content
  });
}

/** A control request's reply content, or null when it fails or takes longer than `waitMs`. */
async function control(
  kernel: Kernel.IKernelConnection,
  msgType: string,
  content: Content,
  waitMs: number
): Promise<Content | null> {
  try {
    const msg = message(kernel, msgType, 'control', content) as KernelMessage.IControlMessage;
    const future = kernel.sendControlMessage(msg, true, true);
    return await within(
      future.done.then(reply => reply.content as unknown as Content),
      waitMs,
      null
    );
  } catch {
    return null; // disconnected, or a connection that cannot send control messages
  }
}

/** Resolves when the connection's websocket is up (at once if it is). */
function connected(kernel: Kernel.IKernelConnection): Promise<void> {
  return new Promise(resolve => {
    if (kernel.connectionStatus === undefined || kernel.connectionStatus === 'connected') {
      resolve();
      return;
    }
    const onChange = (_: unknown, status: Kernel.ConnectionStatus) => {
      if (status === 'connected') {
        kernel.connectionStatusChanged.disconnect(onChange);
        resolve();
      }
    };
    kernel.connectionStatusChanged.connect(onChange);
  });
}

/** One subshell per kernel process for the panel's comm. */
export class PanelSubshell {
  constructor(
    readonly kernel: Kernel.IKernelConnection,
    private readonly _waitMs = CONTROL_WAIT_MS
  ) {}

  /** The subshell's id, created on first use; null where the kernel has none. */
  id(): Promise<string | null> {
    this._id ??= this._create();
    return this._id;
  }

  /** The kernel restarted: its subshells are gone; the next `id()` makes a new one. */
  reset(): void {
    this._id = null;
  }

  /** Send a comm message (`comm_open`, `comm_msg`) on the subshell `id`. */
  send(id: string, msgType: 'comm_open' | 'comm_msg', content: Content): void {
    const channel = this._channel();
    const msg = message(channel, msgType, 'shell', content, id) as KernelMessage.IShellMessage;
    channel.sendShellMessage(msg, false, true);
  }

  /** Ask the kernel to end the subshell and close the panel's connection. */
  dispose(): void {
    const pending = this._id;
    const clone = this._clone;
    this._id = null;
    this._clone = null;
    void (pending ?? Promise.resolve(null)).then(async id => {
      if (id && !this.kernel.isDisposed) {
        await control(clone ?? this.kernel, 'delete_subshell_request', { subshell_id: id }, 1000);
      }
      clone?.dispose();
    });
  }

  /** The panel's own connection to the kernel, or the notebook's where none can be made. */
  private _channel(): Kernel.IKernelConnection {
    if (this._clone === null && typeof this.kernel.clone === 'function') {
      try {
        this._clone = this.kernel.clone({ handleComms: false });
      } catch {
        this._clone = null;
      }
    }
    return this._clone ?? this.kernel;
  }

  private async _create(): Promise<string | null> {
    const channel = this._channel();
    await within(connected(channel), this._waitMs, undefined);
    const info = await control(channel, 'kernel_info_request', {}, this._waitMs);
    const features = (info?.supported_features as string[] | undefined) ?? [];
    if (!features.includes('kernel subshells')) {
      return null;
    }
    const reply = await control(channel, 'create_subshell_request', {}, this._waitMs);
    return reply?.status === 'ok' ? (reply.subshell_id as string) : null;
  }

  private _id: Promise<string | null> | null = null;
  private _clone: Kernel.IKernelConnection | null = null;
}
