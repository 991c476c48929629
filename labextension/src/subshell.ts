/**
 * Put a comm on a kernel subshell (JEP 91) before it is opened, so the
 * kernel answers it on another thread while a cell runs on the main shell.
 *
 * JupyterLab's services start a per-comm-target subshell for every comm by
 * default, but asynchronously: a comm opened at once still goes to the main
 * shell and waits behind the running cell. So we wait (bounded) for the
 * kernel's info, then for the comm's subshell, and open only then. Where the
 * person turned comms over subshells off, our comm still asks for one.
 */
import type { Kernel } from '@jupyterlab/services';

/** How long to wait for the kernel's info or the subshell before opening anyway. */
export const SUBSHELL_WAIT_MS = 3000;

// The enum's value, not the enum: older services do not export it at run time.
const PER_COMM_TARGET = 'perCommTarget' as Kernel.IComm['commsOverSubshells'];
const DISABLED = 'disabled' as Kernel.IComm['commsOverSubshells'];

function within<T>(promise: Promise<T>, ms: number, fallback: T): Promise<T> {
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

/**
 * Resolves true once `comm` will be sent on a subshell, false when the kernel
 * offers none (or did not say within `waitMs`): then it goes on the main shell.
 */
export async function onSubshell(
  kernel: Kernel.IKernelConnection,
  comm: Kernel.IComm,
  waitMs = SUBSHELL_WAIT_MS
): Promise<boolean> {
  const info = (kernel as Partial<Kernel.IKernelConnection>).info;
  if (!info || !(await within(info.then(() => true), waitMs, false))) {
    return false;
  }
  if (!kernel.supportsSubshells) {
    return false;
  }
  if (comm.commsOverSubshells === undefined || comm.commsOverSubshells === DISABLED) {
    comm.commsOverSubshells = PER_COMM_TARGET;
  }
  const started = (comm as { subshellStarted?: Promise<void> }).subshellStarted;
  return started ? within(started.then(() => true), waitMs, false) : false;
}
