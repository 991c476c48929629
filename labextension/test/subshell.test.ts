import { describe, expect, it } from 'vitest';

import type { Kernel } from '@jupyterlab/services';

import { onSubshell } from '../src/subshell';

/** The parts of a kernel connection and a comm that onSubshell reads. */
function fakes(options: {
  info?: Promise<unknown>;
  supports?: boolean;
  mode?: string;
  started?: Promise<void>;
}): { kernel: Kernel.IKernelConnection; comm: Kernel.IComm & { commsOverSubshells?: string } } {
  const kernel = {
    info: options.info,
    supportsSubshells: options.supports ?? false
  } as unknown as Kernel.IKernelConnection;
  const comm = {
    commsOverSubshells: options.mode,
    subshellStarted: options.started
  } as unknown as Kernel.IComm & { commsOverSubshells?: string };
  return { kernel, comm };
}

describe('onSubshell', () => {
  it('says no subshell when the kernel has none', async () => {
    const { kernel, comm } = fakes({ info: Promise.resolve({}), supports: false });
    expect(await onSubshell(kernel, comm)).toBe(false);
  });

  it('waits for the comm subshell when the kernel has them', async () => {
    let started!: () => void;
    const { kernel, comm } = fakes({
      info: Promise.resolve({}),
      supports: true,
      mode: 'perCommTarget',
      started: new Promise<void>(resolve => (started = resolve))
    });
    const result = onSubshell(kernel, comm, 1000);
    setTimeout(() => started(), 10);
    expect(await result).toBe(true);
  });

  it('asks for a subshell where comms over subshells were turned off', async () => {
    const { kernel, comm } = fakes({
      info: Promise.resolve({}),
      supports: true,
      mode: 'disabled',
      started: Promise.resolve()
    });
    expect(await onSubshell(kernel, comm)).toBe(true);
    expect(comm.commsOverSubshells).toBe('perCommTarget');
  });

  it('opens anyway when the kernel does not answer in time', async () => {
    const { kernel, comm } = fakes({ info: new Promise(() => undefined), supports: true });
    expect(await onSubshell(kernel, comm, 20)).toBe(false);
  });

  it('opens anyway when the subshell does not start in time', async () => {
    const { kernel, comm } = fakes({
      info: Promise.resolve({}),
      supports: true,
      mode: 'perCommTarget',
      started: new Promise<void>(() => undefined)
    });
    expect(await onSubshell(kernel, comm, 20)).toBe(false);
  });
});
