/** A few lines of DOM building, so views read like the markup they make. */

type Child = Node | string | null | undefined | false;

export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Record<string, string> = {},
  ...children: Child[]
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    node.setAttribute(key, value);
  }
  append(node, ...children);
  return node;
}

const SVG_NS = 'http://www.w3.org/2000/svg';

export function svg<K extends keyof SVGElementTagNameMap>(
  tag: K,
  attrs: Record<string, string | number> = {},
  ...children: Child[]
): SVGElementTagNameMap[K] {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs)) {
    node.setAttribute(key, String(value));
  }
  append(node, ...children);
  return node;
}

export function append(parent: Node, ...children: Child[]): void {
  for (const child of children) {
    if (child) {
      parent.appendChild(typeof child === 'string' ? document.createTextNode(child) : child);
    }
  }
}

/** Replace all children of `parent`. */
export function replaceChildren(parent: Element, ...children: Child[]): void {
  parent.textContent = '';
  append(parent, ...children);
}

/** A titled block with a summary line, an empty-state line and a body. */
export interface ISection {
  readonly node: HTMLElement;
  readonly summary: HTMLElement;
  readonly empty: HTMLElement;
  readonly body: HTMLElement;
}

export function section(name: string, cls: string): ISection {
  const summary = h('span', { class: 'jp-Phalanx-summary' });
  const empty = h('div', { class: 'jp-Phalanx-empty' });
  const body = h('div', { class: 'jp-Phalanx-body' });
  const node = h(
    'section',
    { class: `jp-Phalanx-section ${cls}`, 'aria-label': name },
    h('header', {}, h('h3', {}, name), summary),
    empty,
    body
  );
  return { node, summary, empty, body };
}

/** Show either the empty-state text or the body. */
export function showEmpty(s: ISection, message: Node | string | null): void {
  s.empty.hidden = message === null;
  s.body.hidden = message !== null;
  if (message !== null) {
    replaceChildren(s.empty, message);
  }
}
