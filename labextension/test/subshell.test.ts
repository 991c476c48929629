import { describe, expect, it } from 'vitest';

import type { Kernel, KernelMessage } from '@jupyterlab/services';

import { PanelSubshell } from '../src/subshell';

/** A connection that answers control requests as the kernel would (or never). */
class FakeKernel {
  constructor(
    private readonly _features: string[] | null,
    private readonly _answers = true
  ) {}
  clientId = 'client';
  username = 'me';
  isDisposed = false;
  control: KernelMessage.IMessage[] = [];
  shell: KernelMessage.IMessage[] = [];
  sendControlMessage(msg: KernelMessage.IMessage) {
    this.control.push(msg);
    const type = msg.header.msg_type;
    let content: Record<string, unknown> = { status: 'ok' };
    if (type === 'kernel_info_request') {
      content = { status: 'ok', supported_features: this._features ?? [] };
    } else if (type === 'create_subshell_request') {
      content = { status: 'ok', subshell_id: `sub-${this.control.length}` };
    }
    const done = this._answers ? Promise.resolve({ content }) : new Promise(() => undefined);
    return { done };
  }
  sendShellMessage(msg: KernelMessage.IMessage) {
    this.shell.push(msg);
  }
  get asKernel(): Kernel.IKernelConnection {
    return this as unknown as Kernel.IKernelConnection;
  }
}

describe('PanelSubshell', () => {
  it('asks on the control channel and creates one subshell per kernel process', async () => {
    const kernel = new FakeKernel(['kernel subshells']);
    const subshell = new PanelSubshell(kernel.asKernel);
    expect(await subshell.id()).toBe('sub-2');
    expect(await subshell.id()).toBe('sub-2'); // reused by every later attempt
    expect(kernel.control.map(m => m.header.msg_type)).toEqual([
      'kernel_info_request',
      'create_subshell_request'
    ]);
    subshell.reset(); // the kernel restarted
    expect(await subshell.id()).toBe('sub-4');
  });

  it('sends comm messages with the subshell in the header', async () => {
    const kernel = new FakeKernel(['kernel subshells']);
    const subshell = new PanelSubshell(kernel.asKernel);
    subshell.send('sub-2', 'comm_msg', { comm_id: 'c', data: { v: 1, type: 'stop_run' } });
    const sent = kernel.shell[0];
    expect(sent.channel).toBe('shell');
    expect(sent.header.msg_type).toBe('comm_msg');
    expect((sent.header as unknown as { subshell_id: string }).subshell_id).toBe('sub-2');
    expect(sent.content).toEqual({ comm_id: 'c', data: { v: 1, type: 'stop_run' } });
  });

  it('has none where the kernel offers no subshells', async () => {
    const kernel = new FakeKernel([]);
    expect(await new PanelSubshell(kernel.asKernel).id()).toBeNull();
    expect(kernel.control).toHaveLength(1); // nothing created
  });

  it('uses the main shell when the control channel does not answer in time', async () => {
    const kernel = new FakeKernel(['kernel subshells'], false);
    expect(await new PanelSubshell(kernel.asKernel, 20).id()).toBeNull();
  });

  it('deletes its subshell when the panel goes away', async () => {
    const kernel = new FakeKernel(['kernel subshells']);
    const subshell = new PanelSubshell(kernel.asKernel);
    await subshell.id();
    subshell.dispose();
    await new Promise(resolve => setTimeout(resolve, 0));
    const last = kernel.control[kernel.control.length - 1];
    expect(last.header.msg_type).toBe('delete_subshell_request');
    expect(last.content).toEqual({ subshell_id: 'sub-2' });
  });
});
