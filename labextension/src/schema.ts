/**
 * Checks a JSON message against a declarative shape: a table of field -> what
 * it must hold. The same interpreter, with the same wording, as
 * `kernel_ext/phalanx/_schema.py`; keep the two in step.
 *
 * A spec says what one field holds; it is one of
 * - a kind name: 'int', 'number', 'string', 'bool', 'list' or 'object'; a
 *   trailing '?' lets the field also be absent or null;
 * - a shape, an object of field name -> spec: an object with those fields
 *   (others pass unchecked);
 * - a `Field` (made by `field()`), for what a kind name cannot say.
 *
 * Example: `check({ n: field('int', { least: 1 }) }, { n: 0 }, 'scale')`
 * throws "scale: n must be at least 1, got 0".
 */

/** A message that does not fit the schema; the message names the field. */
export class SchemaError extends Error {
  override name = 'SchemaError';
}

type Kind = 'int' | 'number' | 'string' | 'bool' | 'list' | 'object';
type Obj = Record<string, unknown>;

/** What a field holds beyond its kind (the options of `Field` in _schema.py). */
export interface IFieldOptions {
  /** Absent or null is fine. */
  optional?: boolean;
  /** What each entry of a list or pair is, or each value of an object. */
  items?: Spec;
  /** The shape of an object. */
  fields?: Shape;
  /** The strings allowed. */
  choices?: readonly string[];
  /** The range of a number. */
  least?: number;
  most?: number;
  /** A sibling number field this one may not be below. */
  notBefore?: string;
  /** One more check of the value, throwing SchemaError. */
  then?: (value: unknown) => void;
}

/** A field's kind ('pair': a list of exactly two `items`) with its options. */
export class Field {
  constructor(
    readonly kind: Kind | 'pair',
    readonly options: IFieldOptions = {}
  ) {}
}

export type Spec = Kind | `${Kind}?` | Field | Shape;
export interface Shape {
  readonly [field: string]: Spec;
}

export function field(kind: Kind | 'pair', options: IFieldOptions = {}): Field {
  return new Field(kind, options);
}

/** The same spec for each of `names` (Python's dict.fromkeys), spread into a shape. */
export function each(names: readonly string[], spec: Spec): Shape {
  return Object.fromEntries(names.map(name => [name, spec]));
}

export function isObject(value: unknown): value is Obj {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** Check that `msg` holds every field of `shape`; throw SchemaError if not. */
export function check(shape: Shape, msg: Obj, where: string, path = ''): void {
  for (const [key, spec] of Object.entries(shape)) {
    const f = asField(spec);
    const name = path + key;
    if ((msg[key] === undefined || msg[key] === null) && f.options.optional) {
      continue;
    }
    if (!Object.hasOwn(msg, key)) {
      throw new SchemaError(`${where}: missing field '${name}'`);
    }
    checkValue(f, msg[key], where, name, msg);
  }
}

function asField(spec: Spec): Field {
  if (spec instanceof Field) {
    return spec;
  }
  if (typeof spec === 'string') {
    return new Field(spec.replace(/\?$/, '') as Kind, { optional: spec.endsWith('?') });
  }
  return new Field('object', { fields: spec });
}

function checkValue(f: Field, value: unknown, where: string, name: string, parent?: Obj): void {
  const { choices, notBefore, then } = f.options;
  if (!fits(value, f.kind)) {
    throw new SchemaError(`${where}: field '${name}' must be ${expected(f)}, got ${kindOf(value)}`);
  }
  if (choices && !choices.includes(value as string)) {
    throw new SchemaError(`${where}: ${name} '${value}' not one of ${choices.join(', ')}`);
  }
  checkRange(f, value as number, where, name);
  if (notBefore !== undefined && parent && (value as number) < (parent[notBefore] as number)) {
    const start = parent[notBefore];
    throw new SchemaError(
      `${where}: ${name} (${value}) is before ${notBefore} (${start}); give ${notBefore} <= ${name}`
    );
  }
  if (f.options.fields) {
    check(f.options.fields, value as Obj, where, name + '.');
  }
  if (f.options.items !== undefined) {
    const item = asField(f.options.items);
    const named = isObject(value)
      ? Object.entries(value).map(([key, v]) => [`${name}.${key}`, v] as const)
      : (value as unknown[]).map((v, i) => [`${name}[${i}]`, v] as const);
    for (const [entryName, entry] of named) {
      if (!(entry === null && item.options.optional)) {
        checkValue(item, entry, where, entryName);
      }
    }
  }
  if (then) {
    try {
      then(value);
    } catch (err) {
      throw err instanceof SchemaError ? new SchemaError(`${where}: ${name}: ${err.message}`) : err;
    }
  }
}

function checkRange(f: Field, value: number, where: string, name: string): void {
  const { least, most } = f.options;
  if (least !== undefined && most !== undefined && !(least <= value && value <= most)) {
    throw new SchemaError(`${where}: ${name} must be between ${least} and ${most}, got ${value}`);
  }
  if (least !== undefined && value < least) {
    throw new SchemaError(`${where}: ${name} must be at least ${least}, got ${value}`);
  }
  if (most !== undefined && value > most) {
    throw new SchemaError(`${where}: ${name} must be at most ${most}, got ${value}`);
  }
}

function fits(value: unknown, kind: Kind | 'pair'): boolean {
  switch (kind) {
    case 'int':
      return typeof value === 'number' && Number.isInteger(value);
    case 'number':
      return typeof value === 'number' && Number.isFinite(value);
    case 'string':
      return typeof value === 'string';
    case 'bool':
      return typeof value === 'boolean';
    case 'list':
      return Array.isArray(value);
    case 'pair':
      return Array.isArray(value) && value.length === 2;
    case 'object':
      return isObject(value);
  }
}

function expected(f: Field): string {
  if (f.kind !== 'pair') {
    return f.kind;
  }
  const item = f.options.items === undefined ? 'any' : asField(f.options.items).kind;
  return `a [${item}, ${item}] pair`;
}

/** The JSON name of a value's kind, as the messages say it. */
export function kindOf(value: unknown): string {
  if (value === null) {
    return 'null';
  }
  if (Array.isArray(value)) {
    return `list of ${value.length}`;
  }
  for (const kind of ['bool', 'int', 'number', 'string', 'object'] as const) {
    if (fits(value, kind)) {
      return kind;
    }
  }
  return typeof value;
}
