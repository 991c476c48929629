import { describe, expect, it } from 'vitest';

import {
  COMM_TARGET,
  Requests,
  SCHEMA_VERSION,
  SchemaError,
  validateEvent,
  validateRequest
} from '../src/protocol';
import messages from './fixtures/messages.json';

// The same file is checked against events.py by tests/test_labcomm.py, so the
// two validators cannot drift apart silently.
describe('protocol mirrors events.py', () => {
  it('speaks the same version and comm target', () => {
    expect(SCHEMA_VERSION).toBe(1);
    expect(COMM_TARGET).toBe('phalanx');
  });

  it.each(messages.valid_events.map(e => [e.type, e]))('accepts a valid %s event', (_, event) => {
    expect(validateEvent(event)).toBe(event);
  });

  it.each(messages.invalid_events.map(e => [JSON.stringify(e), e]))('rejects %s', (_, event) => {
    expect(() => validateEvent(event)).toThrow(SchemaError);
  });

  it.each(messages.valid_requests.map(r => [r.type, r]))(
    'accepts a valid %s request',
    (_, request) => {
      expect(validateRequest(request)).toBe(request);
    }
  );

  it.each(messages.invalid_requests.map(r => [JSON.stringify(r), r]))(
    'rejects request %s',
    (_, request) => {
      expect(() => validateRequest(request)).toThrow(SchemaError);
    }
  );
});

describe('error messages name the field', () => {
  it('names a missing field', () => {
    expect(() => validateEvent({ v: 1, type: 'run_ended', run: 'r', status: 'done' })).toThrow(
      "run_ended: missing field 'wall_s'"
    );
  });

  it('names a wrong version', () => {
    expect(() => validateEvent({ v: 7, type: 'cluster' })).toThrow('schema version 7');
  });

  it('names the path of a nested field', () => {
    const row = { rank: 0, step: 1, t: 0, metrics: { acc: 'high' } };
    expect(() => validateEvent({ v: 1, type: 'metrics', run: 'r', rows: [row] })).toThrow(
      "field 'rows[0].metrics.acc' must be number, got string"
    );
  });

  // The same texts are asserted against events.py by tests/test_events_schema.py.
  it.each(messages.errors.map(c => [c.says, c]))('says %s', (says, c) => {
    const check = () => ('event' in c ? validateEvent(c.event) : validateRequest(c.request));
    expect(check).toThrow(new SchemaError(says));
  });

  it('does not treat inherited keys as event types', () => {
    expect(() => validateEvent({ v: 1, type: 'toString' })).toThrow('unknown event type');
  });
});

describe('Requests', () => {
  it('builds only valid requests', () => {
    expect(Requests.snapshot()).toEqual({ v: 1, type: 'request_snapshot' });
    expect(Requests.scale(3)).toEqual({ v: 1, type: 'scale', n: 3 });
    expect(Requests.stop()).toEqual({ v: 1, type: 'stop' });
    expect(Requests.window('r1', 10, 20, 500)).toEqual({
      v: 1,
      type: 'request_window',
      run: 'r1',
      start: 10,
      end: 20,
      max_points: 500
    });
    expect(() => Requests.window('r1', 20, 10)).toThrow('end (10) is before start (20)');
  });

  it('refuses to build a scale request the kernel would reject', () => {
    expect(() => Requests.scale(0)).toThrow(SchemaError);
    expect(() => Requests.scale(1.5)).toThrow(SchemaError);
  });
});
