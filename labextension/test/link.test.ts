import { Signal } from '@lumino/signaling';
import { beforeEach, describe, expect, it, vi } from 'vitest';

import type { Kernel, KernelMessage } from '@jupyterlab/services';

import { KernelLink, retryDelayMs } from '../src/link';
import { PhalanxModel } from '../src/model';
import { cluster, snapshot } from './events';

/** Just enough of a comm to see what the link sends and to play the kernel's replies. */
let commCount = 0;

class FakeComm {
  constructor(readonly targetName: string) {}
  readonly commId = `comm-${commCount++}`;
  opened: unknown[] = [];
  sent: unknown[] = [];
  closed = false;
  isDisposed = false;
  onMsg: (msg: KernelMessage.ICommMsgMsg) => void = () => undefined;
  onClose: (msg: KernelMessage.ICommCloseMsg) => void = () => undefined;
  open(data: unknown): void {
    this.opened.push(data);
  }
  send(data: unknown): void {
    this.sent.push(data);
  }
  close(): void {
    this.closed = true;
  }
  dispose(): void {
    this.isDisposed = true;
  }
  // the kernel's side
  reply(data: unknown): void {
    this.onMsg({ content: { comm_id: this.commId, data } } as KernelMessage.ICommMsgMsg);
  }
  refuse(): void {
    this.onClose({ content: { comm_id: this.commId, data: {} } } as KernelMessage.ICommCloseMsg);
  }
}

class FakeKernel {
  status: KernelMessage.Status = 'idle';
  isDisposed = false;
  handleComms = true;
  comms: FakeComm[] = [];
  targets = new Map<string, () => void>();
  statusChanged = new Signal<this, KernelMessage.Status>(this);
  createComm(target: string): FakeComm {
    if (!this.handleComms) {
      throw new Error('Comms are disabled on this kernel connection');
    }
    const comm = new FakeComm(target);
    this.comms.push(comm);
    return comm;
  }
  registerCommTarget(target: string, cb: () => void): void {
    this.targets.set(target, cb);
  }
  removeCommTarget(target: string): void {
    this.targets.delete(target);
  }
  setStatus(status: KernelMessage.Status): void {
    this.status = status;
    this.statusChanged.emit(status);
  }
  announce(): void {
    this.targets.get('phalanx')?.();
  }
  get last(): FakeComm {
    return this.comms[this.comms.length - 1];
  }
}

describe('KernelLink', () => {
  let kernel: FakeKernel;
  let model: PhalanxModel;
  let now: number;
  const link = () =>
    new KernelLink({
      kernel: kernel as unknown as Kernel.IKernelConnection,
      model,
      now: () => now
    });

  beforeEach(() => {
    kernel = new FakeKernel();
    model = new PhalanxModel({ logger: { warn: () => undefined } });
    now = 1000;
  });

  it('opens the comm at once, asking for a snapshot', () => {
    link();
    expect(kernel.comms).toHaveLength(1);
    expect(kernel.last.targetName).toBe('phalanx');
    expect(kernel.last.opened).toEqual([{ v: 1, type: 'request_snapshot' }]);
    expect(model.connection).toBe('waiting');
  });

  it('is attached after the first valid message', () => {
    const l = link();
    kernel.last.reply({ v: 1, type: 'nonsense' });
    expect(l.attached).toBe(false);
    kernel.last.reply(snapshot([cluster(2)]));
    expect(l.attached).toBe(true);
    expect(model.connection).toBe('attached');
    expect(model.cluster?.engines).toHaveLength(2);
  });

  it('waits when refused, then attaches on the kernel announcement', () => {
    link();
    kernel.last.refuse(); // no target: phalanx not loaded
    expect(model.connection).toBe('waiting');
    kernel.announce(); // %load_ext phalanx
    expect(kernel.comms).toHaveLength(2);
    kernel.last.reply(snapshot([]));
    expect(model.connection).toBe('attached');
  });

  it('retries on an announcement that raced with a refused attempt', () => {
    link();
    kernel.announce(); // the first attempt is still in flight
    expect(kernel.comms).toHaveLength(1);
    kernel.comms[0].refuse();
    expect(kernel.comms).toHaveLength(2);
  });

  it('falls back to idle retries with backoff', () => {
    link();
    kernel.last.refuse();
    kernel.setStatus('idle'); // too soon after the failure
    expect(kernel.comms).toHaveLength(1);
    now += retryDelayMs(1);
    kernel.setStatus('idle');
    expect(kernel.comms).toHaveLength(2);
    kernel.last.refuse();
    now += retryDelayMs(1);
    kernel.setStatus('idle'); // the second failure waits longer
    expect(kernel.comms).toHaveLength(2);
    now += retryDelayMs(2);
    kernel.setStatus('idle');
    expect(kernel.comms).toHaveLength(3);
  });

  it('never opens two comms at once', () => {
    link();
    now += 60_000;
    kernel.setStatus('busy');
    kernel.setStatus('idle');
    kernel.announce();
    expect(kernel.comms).toHaveLength(1);
  });

  it('clears the model on restart and tries again once the kernel is back', () => {
    const l = link();
    kernel.last.reply(snapshot([cluster(2)]));
    kernel.setStatus('restarting');
    expect(model.cluster).toBeNull();
    expect(model.connection).toBe('waiting');
    expect(l.attached).toBe(false);
    expect(kernel.comms[0].isDisposed).toBe(true);
    expect(kernel.comms[0].closed).toBe(false); // nothing to tell a dead kernel
    kernel.setStatus('starting');
    expect(kernel.comms).toHaveLength(1);
    kernel.setStatus('idle');
    expect(kernel.comms).toHaveLength(2);
  });

  it('clears when the kernel closes an attached comm (unload)', () => {
    link();
    kernel.last.reply(snapshot([cluster(1)]));
    kernel.last.refuse();
    expect(model.cluster).toBeNull();
    expect(model.connection).toBe('waiting');
  });

  it('sends typed requests only when attached', () => {
    const l = link();
    expect(l.send({ v: 1, type: 'stop' })).toBe(false);
    kernel.last.reply(snapshot([]));
    expect(l.send({ v: 1, type: 'scale', n: 3 })).toBe(true);
    expect(kernel.last.sent).toEqual([{ v: 1, type: 'scale', n: 3 }]);
    expect(() => l.send({ v: 1, type: 'scale', n: -1 })).toThrow('at least 1');
  });

  it('ignores messages of a comm it already dropped', () => {
    link();
    const first = kernel.last;
    kernel.setStatus('restarting');
    first.reply(snapshot([cluster(3)]));
    expect(model.cluster).toBeNull();
  });

  it('closes its comm and target on dispose', () => {
    const l = link();
    kernel.last.reply(snapshot([]));
    l.dispose();
    expect(kernel.last.closed).toBe(true);
    expect(kernel.targets.size).toBe(0);
    kernel.setStatus('idle');
    expect(kernel.comms).toHaveLength(1);
  });

  it('survives a connection that does not handle comms', () => {
    kernel.handleComms = false;
    const warn = vi.spyOn(console, 'warn').mockImplementation(() => undefined);
    const l = link();
    expect(l.attached).toBe(false);
    expect(model.connection).toBe('waiting');
    expect(warn).toHaveBeenCalledOnce();
    warn.mockRestore();
  });

  it('backs off up to 30 s', () => {
    expect([0, 1, 2, 3, 10].map(retryDelayMs)).toEqual([0, 1000, 2000, 4000, 30_000]);
  });
});
