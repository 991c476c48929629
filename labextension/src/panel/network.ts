/**
 * Network section: the learning network's DAG drawn left to right, nodes
 * coloured by state; clicking a node shows its estimator, parameters and
 * last action. Layout is recomputed only when the network event changes.
 */
import { IDagLayout, layoutNetwork, NODE_HEIGHT, stateText, statusLine } from '../dag';
import * as fmt from '../format';
import { PhalanxModel } from '../model';
import { INetworkEvent, INetworkNode, NODE_STATES } from '../protocol';
import { h, ISection, replaceChildren, section, showEmpty, svg } from './dom';

/** The smallest the DAG is drawn, as a share of its natural size (its labels stay readable). */
const MIN_DAG_SCALE = 0.7;

export class NetworkView {
  constructor() {
    this._section = section('Network', 'jp-Phalanx-network');
    this._picker = h('select', { class: 'jp-Phalanx-networkPicker', 'aria-label': 'network' });
    this._picker.onchange = () => {
      this._selectedNode = null;
      this._render();
    };
    this._graph = h('div', { class: 'jp-Phalanx-dag' });
    this._details = h('div', { class: 'jp-Phalanx-details' });
    const legend = h(
      'div',
      { class: 'jp-Phalanx-legend' },
      ...NODE_STATES.map(s => h('span', { class: `jp-Phalanx-legendItem jp-Phalanx-node-${s}` }, s))
    );
    this._section.body.append(this._picker, this._graph, legend, this._details);
  }

  get node(): HTMLElement {
    return this._section.node;
  }

  update(model: PhalanxModel | null): void {
    this._networks = model?.connection === 'attached' ? model.networks : new Map();
    if (this._networks.size === 0) {
      this._section.summary.textContent = '';
      showEmpty(this._section, emptyMessage(model));
      this._laidOut = null;
      return;
    }
    showEmpty(this._section, null);
    const names = [...this._networks.keys()];
    if (names.join('\n') !== [...this._picker.options].map(o => o.value).join('\n')) {
      const keep = this._picker.value;
      replaceChildren(this._picker, ...names.map(n => h('option', { value: n }, n)));
      // Follow the newest network unless the user picked one that still exists.
      this._picker.value = names.includes(keep) ? keep : names[names.length - 1];
    }
    this._picker.hidden = names.length < 2;
    this._render();
  }

  private _render(): void {
    const network = this._networks.get(this._picker.value);
    if (!network) {
      return;
    }
    const counts = new Map<string, number>();
    for (const n of network.nodes) {
      counts.set(n.state, (counts.get(n.state) ?? 0) + 1);
    }
    this._section.summary.textContent = [
      network.network,
      ...[...counts].map(([s, c]) => `${c} ${s}`)
    ].join(' · ');
    if (!this._laidOut || this._laidOut.event !== network) {
      this._laidOut = { event: network, layout: layoutNetwork(network) };
    }
    replaceChildren(this._graph, this._drawGraph(this._laidOut.layout));
    const selected = network.nodes.find(n => n.id === this._selectedNode) ?? null;
    replaceChildren(
      this._details,
      selected
        ? details(selected)
        : 'Click a node to see its estimator, parameters and last action.'
    );
  }

  private _drawGraph(layout: IDagLayout): SVGSVGElement {
    const root = svg('svg', {
      class: 'jp-Phalanx-dagSvg',
      // Scaled down to the panel's width (the style's max-width), but not below 70% of its
      // natural size: smaller, labels become unreadable, and the box scrolls sideways.
      viewBox: `0 0 ${layout.width} ${layout.height}`,
      width: layout.width,
      height: layout.height,
      style: `min-width: ${Math.round(layout.width * MIN_DAG_SCALE)}px`,
      role: 'img',
      'aria-label': 'learning network'
    });
    root.append(
      svg(
        'defs',
        {},
        svg(
          'marker',
          {
            id: 'jp-Phalanx-arrow',
            viewBox: '0 0 10 10',
            refX: 9,
            refY: 5,
            markerWidth: 6,
            markerHeight: 6,
            orient: 'auto'
          },
          svg('path', { d: 'M0,0 L10,5 L0,10 z', class: 'jp-Phalanx-arrow' })
        )
      )
    );
    for (const edge of layout.edges) {
      const d = edge.points.map((p, i) => `${i === 0 ? 'M' : 'L'}${p.x},${p.y}`).join(' ');
      root.append(
        svg('path', { d, class: 'jp-Phalanx-edge', 'marker-end': 'url(#jp-Phalanx-arrow)' })
      );
    }
    for (const box of layout.nodes) {
      const n = box.node;
      const g = svg(
        'g',
        {
          class: `jp-Phalanx-dagNode jp-Phalanx-node-${n.state}${n.id === this._selectedNode ? ' jp-mod-selected' : ''}`,
          transform: `translate(${box.x},${box.y})`,
          'data-node': n.id,
          'data-state': n.state,
          tabindex: 0
        },
        svg('rect', { width: box.width, height: box.height, rx: 5 }),
        svg('text', { x: 8, y: 15, class: 'jp-Phalanx-nodeLabel' }, n.label),
        svg('text', { x: 8, y: NODE_HEIGHT - 8, class: 'jp-Phalanx-nodeStatus' }, statusLine(n))
      );
      g.append(svg('title', {}, `${n.label} (${n.kind}): ${stateText(n)}`));
      const select = (): void => {
        this._selectedNode = n.id;
        this._render();
      };
      // No focus on mouse down: focusing would scroll the graph to the node under the pointer.
      g.addEventListener('mousedown', event => event.preventDefault());
      g.addEventListener('click', select);
      g.addEventListener('keydown', event => {
        if (event.key === 'Enter' || event.key === ' ') {
          select();
        }
      });
      root.append(g);
    }
    return root;
  }

  private _section: ISection;
  private _picker: HTMLSelectElement;
  private _graph: HTMLElement;
  private _details: HTMLElement;
  private _networks: ReadonlyMap<string, INetworkEvent> = new Map();
  private _laidOut: { event: INetworkEvent; layout: IDagLayout } | null = null;
  private _selectedNode: string | null = null;
}

function details(n: INetworkNode): HTMLElement {
  const params = Object.entries(n.params ?? {});
  return h(
    'div',
    { 'data-node': n.id },
    h('div', { class: 'jp-Phalanx-detailsTitle' }, `${n.label} · ${n.kind}`),
    h(
      'dl',
      {},
      h('dt', {}, 'estimator'),
      h('dd', {}, n.estimator ?? '–'),
      h('dt', {}, 'state'),
      h('dd', {}, stateText(n)),
      h('dt', {}, 'last action'),
      h('dd', {}, n.last_action ?? '–')
    ),
    params.length
      ? h(
          'table',
          { class: 'jp-Phalanx-table jp-Phalanx-params' },
          h(
            'tbody',
            {},
            ...params.map(([k, v]) => h('tr', {}, h('td', {}, k), h('td', {}, fmt.param(v))))
          )
        )
      : h('div', { class: 'jp-Phalanx-muted' }, 'no parameters')
  );
}

function emptyMessage(model: PhalanxModel | null): Node | string {
  if (!model || model.connection !== 'attached') {
    return 'No learning network.';
  }
  return 'No learning network yet. Fit one on the cluster to see its DAG here.';
}
