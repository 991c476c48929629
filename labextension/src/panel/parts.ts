/**
 * Where a rank's step time goes, as a stacked bar: data & forward, backward,
 * waiting for a peer, moving bytes, optimizer, log(), other (the parts the
 * kernel sends in `time` events; they add up to the rank's step time).
 */
import type { IRankTime } from '../protocol';
import { h } from './dom';

/** Parts in the order they stack, with what the panel calls them. */
export const STEP_PARTS: ReadonlyArray<readonly [string, string]> = [
  ['data', 'data & forward'],
  ['backward', 'backward'],
  ['wait', 'waiting for a peer'],
  ['move', 'moving bytes'],
  ['optimizer', 'optimizer'],
  ['log', 'log()'],
  ['other', 'other']
];

export interface IPartShare {
  readonly part: string;
  readonly label: string;
  readonly seconds: number;
  readonly share: number;
}

/** Each part's share of the step time, in stacking order (empty before a step is done). */
export function partShares(t: IRankTime | undefined): IPartShare[] {
  const parts = t?.parts;
  const total = t?.step_s ?? 0;
  if (!parts || !(total > 0)) {
    return [];
  }
  // Backward is part of "data & forward" where phalanx has no gradient hooks (DDP, param averaging).
  const hooked = (parts.backward ?? 0) > 0;
  return STEP_PARTS.map(([part, label]) => ({
    part,
    label: part === 'data' && !hooked ? 'data, forward & backward' : label,
    seconds: parts[part] ?? 0,
    share: (parts[part] ?? 0) / total
  }));
}

/**
 * The parts of at least 1% in words, largest first, so a caption cut short
 * by a narrow panel still says where most of the time goes.
 */
export function captionParts(shares: readonly IPartShare[]): string {
  return [...shares]
    .filter(s => s.share >= 0.01)
    .sort((a, b) => b.share - a.share)
    .map(s => `${s.label} ${Math.round(s.share * 100)}%`)
    .join(', ');
}

/** The stacked bar and its caption for one rank, or null before it finished a step. */
export function partsBar(t: IRankTime | undefined): HTMLElement | null {
  const shares = partShares(t);
  if (!t || shares.length === 0) {
    return null;
  }
  const perStep = (t.step_s ?? 0) / Math.max(t.steps ?? 1, 1);
  const segments = shares
    .filter(s => s.share > 0)
    .map(s =>
      h('div', {
        class: `jp-Phalanx-part jp-Phalanx-part-${s.part}`,
        'data-part': s.part,
        style: `width: ${(s.share * 100).toFixed(2)}%`,
        title: `${s.label}: ${Math.round(s.share * 100)}% (${s.seconds.toFixed(3)} s)`
      })
    );
  const caption = `${perStep.toPrecision(3)} s/step: ${captionParts(shares)}`;
  const slow = t.slow ? `slow: ${t.slow}` : null;
  return h(
    'div',
    { class: 'jp-Phalanx-parts', 'data-dominant': t.dominant ?? '' },
    h(
      'div',
      { class: 'jp-Phalanx-partsBar', role: 'img', 'aria-label': 'step time parts' },
      ...segments
    ),
    // One line each, cut with an ellipsis in a narrow panel; the whole text on hover.
    h('span', { class: 'jp-Phalanx-partsText', title: caption }, caption),
    slow ? h('span', { class: 'jp-Phalanx-slow', title: slow }, slow) : null
  );
}
