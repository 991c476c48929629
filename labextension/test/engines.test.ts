import { describe, expect, it } from 'vitest';

import { engineColumns, PendingRequest } from '../src/engines';
import { cluster } from './events';

describe('engineColumns', () => {
  it('leaves out memory and step when no engine reports them', () => {
    const engines = cluster(2).engines.map(e => ({ ...e, memory_mb: null, step: undefined }));
    expect(engineColumns(engines)).toEqual(['rank', 'host', 'device', 'state']);
  });

  it('shows a column as soon as one engine reports it', () => {
    const engines = cluster(2).engines.map(e => ({ ...e, memory_mb: null }));
    engines[1] = { ...engines[1], step: 7 };
    expect(engineColumns(engines)).toEqual(['rank', 'host', 'device', 'state', 'step']);
    expect(engineColumns(cluster(1).engines)).toContain('memory');
  });
});

describe('PendingRequest', () => {
  it('waits until the kernel sends a new cluster state', () => {
    const before = cluster(2);
    const pending = new PendingRequest('scaling to 3…', before, 3);
    expect(pending.answeredBy(before)).toBe(false);
    expect(pending.answeredBy(cluster(3))).toBe(true);
    expect(pending.answeredBy(cluster(2, { error: 'too many' }))).toBe(true);
    expect(pending.target).toBe(3);
  });
});
