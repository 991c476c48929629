/**
 * Left-to-right layout of a learning network with dagre: node boxes and
 * edge polylines in one coordinate space, ready to draw. No DOM.
 */
import dagre, { EdgeLabel, GraphLabel, NodeLabel } from '@dagrejs/dagre';

import { fitTime } from './format';
import type { INetworkEvent, INetworkNode } from './protocol';

export interface INodeBox {
  readonly node: INetworkNode;
  /** Top-left corner and size. */
  readonly x: number;
  readonly y: number;
  readonly width: number;
  readonly height: number;
}

export interface IEdgePath {
  readonly source: string;
  readonly target: string;
  readonly points: { x: number; y: number }[];
}

export interface IDagLayout {
  readonly width: number;
  readonly height: number;
  readonly nodes: INodeBox[];
  readonly edges: IEdgePath[];
}

export const NODE_HEIGHT = 38;
const CHAR_WIDTH = 6.5; // ~12px UI font; boxes only need to be roughly right
const PADDING = 16;

/** The width a node needs for its label and its status line. */
export function nodeWidth(node: INetworkNode): number {
  const status = statusLine(node);
  return Math.max(64, PADDING + CHAR_WIDTH * Math.max(node.label.length, status.length));
}

/** A node's state with its fit time when it has one: "fitted 1.23 s", "queued". */
export function stateText(node: INetworkNode): string {
  const t = node.fit_time_s;
  return t === null || t === undefined ? node.state : `${node.state} ${fitTime(t)}`;
}

/**
 * The second line of a node box. Sources hold data rather than a model, so
 * they say "source" (or "no data") instead of "fitted" (or "fresh").
 */
export function statusLine(node: INetworkNode): string {
  if (node.kind === 'source' && (node.state === 'fitted' || node.state === 'fresh')) {
    return node.state === 'fitted' ? 'source' : 'no data';
  }
  return stateText(node);
}

export function layoutNetwork(network: INetworkEvent): IDagLayout {
  const g = new dagre.graphlib.Graph<GraphLabel, NodeLabel, EdgeLabel>();
  g.setGraph({ rankdir: 'LR', nodesep: 12, ranksep: 28, marginx: 4, marginy: 4 });
  g.setDefaultEdgeLabel(() => ({}));
  const known = new Set<string>();
  for (const node of network.nodes) {
    known.add(node.id);
    g.setNode(node.id, { width: nodeWidth(node), height: NODE_HEIGHT });
  }
  // An edge to a node we were not told about would make dagre invent one.
  const edges = network.edges.filter(([a, b]) => known.has(a) && known.has(b));
  for (const [a, b] of edges) {
    g.setEdge(a, b);
  }
  dagre.layout(g);
  const nodes = network.nodes.map(node => {
    // dagre gives centres; boxes are drawn from their top-left corner.
    const { x = 0, y = 0, width, height } = g.node(node.id);
    return { node, x: x - width / 2, y: y - height / 2, width, height };
  });
  const paths = edges.map(([source, target]) => ({
    source,
    target,
    points: (g.edge(source, target).points ?? []).map(p => ({ x: p.x, y: p.y }))
  }));
  const graph = g.graph();
  return { width: graph.width ?? 0, height: graph.height ?? 0, nodes, edges: paths };
}
