/**
 * The wire protocol between the panel and the kernel: a mirror of
 * `kernel_ext/phalanx/events.py`. The message types live in `messages.ts`;
 * here is what each event and request must hold, as a table read by the
 * interpreter in `schema.ts`. Keep the table in step with events.py; both ends
 * validate (test/fixtures/messages.json is checked by both), and a message
 * that does not fit is logged and dropped, never half-applied.
 */

import {
  ENGINE_STATES,
  MAX_LOG_LINES,
  MAX_WINDOW_POINTS,
  NODE_STATES,
  PhalanxEvent,
  PhalanxRequest,
  RUN_STATES,
  SCHEMA_VERSION
} from './messages';
import { check, each, field, isObject, kindOf, SchemaError, Shape } from './schema';

export * from './messages';
export { SchemaError } from './schema';

// 'number?': a figure the kernel may not know yet, absent or null.
const ENGINE: Shape = {
  rank: 'int',
  engine_id: 'int',
  host: 'string',
  state: field('string', { choices: ENGINE_STATES }),
  ...each(
    ['memory_mb', 'step', 'pid', 'cuda_allocated_mb', 'cuda_reserved_mb', 'cuda_peak_mb'],
    'number?'
  )
};
const RANK_PROGRESS: Shape = {
  rank: 'int',
  step: 'int',
  ...each(['total', 'steps_per_s', 'eta_s'], 'number?'),
  metrics: 'object?'
};
const ROWS = field('list', {
  items: { rank: 'int', step: 'int', t: 'number', metrics: field('object', { items: 'number' }) }
});
// The mean over ranks of each metric by step: {metric: [[step, mean], ...]}.
const MEANS = field('object', {
  optional: true,
  items: field('list', { items: field('pair', { items: 'number' }) })
});
const NODE: Shape = {
  id: 'string',
  label: 'string',
  kind: 'string',
  state: field('string', { choices: NODE_STATES }),
  fit_time_s: 'number?'
};
const RANK_MEMORY: Shape = {
  rank: 'int',
  t: 'number',
  ...each(
    ['rss_mb', 'cuda_allocated_mb', 'cuda_reserved_mb', 'cuda_peak_mb', 'cuda_total_mb'],
    'number?'
  )
};
// Seconds in collectives and log(); once the rank finished a step, the step's parts too.
const RANK_TIME: Shape = {
  rank: 'int',
  ...each(
    ['collective_s', 'collective_wait_s', 'collective_move_s', 'collectives', 'log_s'],
    'number'
  ),
  ...each(['steps', 'step_s', 'dominant_share'], 'number?'),
  parts: field('object', { optional: true, items: 'number' }),
  dominant: 'string?',
  slow: 'string?'
};
// A step window of one run (a zoomed chart), start <= end.
const WINDOW: Shape = {
  run: 'string',
  start: 'number',
  end: field('number', { notBefore: 'start' })
};

// One of the kernel's runs (the run list) and what a finished run's record holds besides.
const RUN_ENTRY: Shape = {
  run: 'string',
  name: 'string?',
  status: field('string', { choices: RUN_STATES }),
  world_size: 'int',
  wall_s: 'number?',
  error: 'string?'
};

/** One event of a snapshot: any valid event but another snapshot. */
function innerEvent(event: unknown): void {
  if (validateEvent(event).type === 'snapshot') {
    throw new SchemaError('a snapshot cannot contain a snapshot');
  }
}

export const EVENT_FIELDS: Record<PhalanxEvent['type'], Shape> = {
  cluster: {
    engines: field('list', { items: ENGINE }),
    max_engines: 'int',
    busy: 'bool',
    error: 'string?',
    notice: 'string?'
  },
  run_started: { run: 'string', world_size: 'int', total_steps: 'number?', name: 'string?' },
  progress: { run: 'string', ranks: field('list', { items: RANK_PROGRESS }) },
  metrics: { run: 'string', rows: ROWS, means: MEANS },
  run_ended: {
    run: 'string',
    status: field('string', { choices: RUN_STATES }),
    wall_s: 'number',
    error: 'string?'
  },
  network: {
    network: 'string',
    nodes: field('list', { items: NODE }),
    edges: field('list', { items: field('pair', { items: 'string' }) })
  },
  snapshot: { events: field('list', { items: field('object', { then: innerEvent }) }) },
  memory: { run: 'string', ranks: field('list', { items: RANK_MEMORY }) },
  time: { run: 'string', ranks: field('list', { items: RANK_TIME }) },
  history_window: { ...WINDOW, rows: ROWS, means: MEANS },
  runs: { runs: field('list', { items: RUN_ENTRY }) },
  run_record: {
    ...RUN_ENTRY,
    total_steps: 'number?',
    strategy: 'string?',
    ranks: field('list', { items: RANK_PROGRESS }),
    times: field('list', { items: RANK_TIME })
  },
  // the answer to request_log: the cluster log's file and last lines
  engine_log: { path: 'string?', lines: field('list', { items: 'string' }) }
};

export const REQUEST_FIELDS: Record<PhalanxRequest['type'], Shape> = {
  request_snapshot: {},
  scale: { n: field('int', { least: 1 }) },
  stop: {},
  stop_run: {},
  request_window: {
    ...WINDOW,
    max_points: field('int', { optional: true, least: 1, most: MAX_WINDOW_POINTS })
  },
  // the next run records `steps` (5) steps: --profile
  profile_next: { steps: field('int', { optional: true, least: 1 }) },
  // an earlier run's record (run_record, then its curves as metrics)
  request_run: { run: 'string' },
  // the last `lines` (200) lines of the cluster's log: what its engines said that is not the user's
  request_log: { lines: field('int', { optional: true, least: 1, most: MAX_LOG_LINES }) }
};

function validate<T>(msg: unknown, shapes: Record<string, Shape>, kind: string): T {
  if (!isObject(msg)) {
    throw new SchemaError(`${kind} must be a JSON object, got ${kindOf(msg)}`);
  }
  if (msg.v !== SCHEMA_VERSION) {
    throw new SchemaError(
      `${kind} has schema version ${JSON.stringify(msg.v)}; this side speaks ${SCHEMA_VERSION}`
    );
  }
  const type = msg.type;
  if (typeof type !== 'string' || !Object.hasOwn(shapes, type)) {
    throw new SchemaError(
      `unknown ${kind} type ${JSON.stringify(type)}; known: ${Object.keys(shapes).sort().join(', ')}`
    );
  }
  check(shapes[type], msg, type);
  return msg as T;
}

/**
 * Check a kernel -> panel event; return it typed or throw SchemaError.
 *
 * Example: `validateEvent({v: 1, type: 'run_ended', run: 'r', status: 'done', wall_s: 1})`.
 */
export function validateEvent(msg: unknown): PhalanxEvent {
  return validate<PhalanxEvent>(msg, EVENT_FIELDS, 'event');
}

/** Check a panel -> kernel request (the panel validates what it sends, too). */
export function validateRequest(msg: unknown): PhalanxRequest {
  return validate<PhalanxRequest>(msg, REQUEST_FIELDS, 'request');
}

/** Request constructors: the only messages the panel ever sends. */
export namespace Requests {
  export function snapshot(): PhalanxRequest {
    return { v: SCHEMA_VERSION, type: 'request_snapshot' };
  }

  export function scale(n: number): PhalanxRequest {
    return validateRequest({ v: SCHEMA_VERSION, type: 'scale', n });
  }

  export function stop(): PhalanxRequest {
    return { v: SCHEMA_VERSION, type: 'stop' };
  }

  /** Stop the running run (the cluster stays). */
  export function stopRun(): PhalanxRequest {
    return { v: SCHEMA_VERSION, type: 'stop_run' };
  }

  /** Ask for `run`'s rows with `start <= step <= end`, up to `maxPoints` per line. */
  export function window(
    run: string,
    start: number,
    end: number,
    maxPoints?: number
  ): PhalanxRequest {
    return validateRequest({
      v: SCHEMA_VERSION,
      type: 'request_window',
      run,
      start,
      end,
      ...(maxPoints === undefined ? {} : { max_points: maxPoints })
    });
  }

  /** Ask for an earlier run's record and curves (the run list's pick). */
  export function run(id: string): PhalanxRequest {
    return validateRequest({ v: SCHEMA_VERSION, type: 'request_run', run: id });
  }

  /** Ask for the cluster log's last `lines` lines (the kernel's default, 200, if omitted). */
  export function log(lines?: number): PhalanxRequest {
    return validateRequest({
      v: SCHEMA_VERSION,
      type: 'request_log',
      ...(lines === undefined ? {} : { lines })
    });
  }

  /** Record the next run's first `steps` optimizer steps on every rank (--profile). */
  export function profileNext(steps = 5): PhalanxRequest {
    return validateRequest({ v: SCHEMA_VERSION, type: 'profile_next', steps });
  }
}
