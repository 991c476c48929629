import { describe, expect, it } from 'vitest';

import { layoutNetwork, nodeWidth, stateText, statusLine } from '../src/dag';
import * as fmt from '../src/format';
import { network } from './events';

describe('format', () => {
  it('formats durations', () => {
    expect(fmt.duration(0.42)).toBe('0.4 s');
    expect(fmt.duration(42)).toBe('42 s');
    expect(fmt.duration(75)).toBe('1 min 15 s');
    expect(fmt.duration(4000)).toBe('1 h 6 min');
    expect(fmt.duration(null)).toBe('–');
  });

  it('formats memory, rates and metrics', () => {
    expect(fmt.memory(812.4)).toBe('812 MB');
    expect(fmt.memory(2048)).toBe('2.0 GB');
    expect(fmt.rate(35.123)).toBe('35.1 steps/s');
    expect(fmt.rate(1234.5)).toBe('1235 steps/s');
    expect(fmt.metric(0.000012345)).toBe('1.234e-5');
    expect(fmt.metric(0.5)).toBe('0.5');
    expect(fmt.param({ a: 1 })).toBe('{"a":1}');
  });

  it('formats fit times so that fast fits do not read as zero', () => {
    expect(fmt.fitTime(0.0063)).toBe('6 ms');
    expect(fmt.fitTime(0.0002)).toBe('<1 ms');
    expect(fmt.fitTime(1.234)).toBe('1.23 s');
    expect(fmt.fitTime(42.4)).toBe('42 s');
    expect(fmt.fitTime(null)).toBe('–');
  });
});

describe('layoutNetwork', () => {
  it('lays a chain out left to right', () => {
    const layout = layoutNetwork(network('n', ['fitted', 'fitting', 'queued']));
    const xs = layout.nodes.map(n => n.x);
    expect(xs[0]).toBeLessThan(xs[1]);
    expect(xs[1]).toBeLessThan(xs[2]);
    expect(layout.edges).toHaveLength(2);
    expect(layout.edges[0].points.length).toBeGreaterThanOrEqual(2);
    for (const box of layout.nodes) {
      expect(box.x + box.width).toBeLessThanOrEqual(layout.width);
      expect(box.y + box.height).toBeLessThanOrEqual(layout.height);
    }
  });

  it('puts independent branches side by side', () => {
    const net = network('n', ['fresh', 'fresh', 'fresh']);
    net.edges = [
      ['n0', 'n1'],
      ['n0', 'n2']
    ];
    const [root, a, b] = layoutNetwork(net).nodes;
    expect(a.x).toBe(b.x);
    expect(a.x).toBeGreaterThan(root.x);
    expect(a.y).not.toBe(b.y);
  });

  it('ignores edges to unknown nodes', () => {
    const net = network('n', ['fresh']);
    net.edges = [['n0', 'ghost']];
    const layout = layoutNetwork(net);
    expect(layout.nodes).toHaveLength(1);
    expect(layout.edges).toHaveLength(0);
  });

  it('sizes nodes for their label and fit time', () => {
    const node = {
      id: 'a',
      label: 'a much longer label',
      kind: 'm',
      state: 'fitted' as const,
      fit_time_s: 1.234
    };
    expect(statusLine(node)).toBe('fitted 1.23 s');
    expect(statusLine({ ...node, fit_time_s: 0.004 })).toBe('fitted 4 ms');
    expect(nodeWidth(node)).toBeGreaterThan(nodeWidth({ ...node, label: 'x' }));
  });

  it('says "source" for data, not "fitted"', () => {
    const source = { id: 'X', label: 'X', kind: 'source', state: 'fitted' as const };
    expect(statusLine(source)).toBe('source');
    expect(statusLine({ ...source, state: 'fresh' })).toBe('no data');
    expect(stateText(source)).toBe('fitted');
  });
});
