/**
 * The loss chart: one uPlot instance, one line per rank plus the mean. The
 * plot is rebuilt only when its series or scale change; new rows just
 * replace the data (uPlot redraws a canvas, cheap even for long histories).
 */
import uPlot from 'uplot';

import { alignSeries } from '../chartdata';
import { MetricHistory } from '../history';

const PALETTE = [
  '#1f77b4',
  '#ff7f0e',
  '#2ca02c',
  '#d62728',
  '#9467bd',
  '#8c564b',
  '#e377c2',
  '#17becf'
];
const HEIGHT = 180;

export function rankColor(rank: number): string {
  return PALETTE[rank % PALETTE.length];
}

/** Canvas strokes do not understand CSS variables: resolve the theme's value. */
function themeColor(name: string, fallback: string): string {
  return getComputedStyle(document.body).getPropertyValue(name).trim() || fallback;
}

export class LossChart {
  constructor() {
    this.node = document.createElement('div');
    this.node.className = 'jp-Phalanx-chart';
    // The sidebar is resized by the user: follow its width.
    this._resize = new ResizeObserver(() => this._fit());
    this._resize.observe(this.node);
  }

  readonly node: HTMLDivElement;

  /** Draw `metric` of `history`; cheap when nothing changed. */
  draw(history: MetricHistory, metric: string, logScale: boolean): void {
    const key = `${metric}|${logScale}`;
    if (history === this._history && key === this._key && history.rowCount === this._rows) {
      return;
    }
    const columns = alignSeries(history.series(metric), logScale);
    const shape = `${key}|${columns.ranks.join(',')}`;
    if (!this._plot || shape !== this._shape) {
      this._plot?.destroy();
      this._plot = new uPlot(
        this._options(metric, columns.ranks, logScale),
        columns.data,
        this.node
      );
      this._shape = shape;
    } else {
      this._plot.setData(columns.data);
    }
    this._history = history;
    this._key = key;
    this._rows = history.rowCount;
  }

  /** Number of x points drawn (tests read it through the DOM's data attribute). */
  get points(): number {
    return this._plot?.data[0]?.length ?? 0;
  }

  clear(): void {
    this._plot?.destroy();
    this._plot = null;
    this._history = null;
    this._shape = '';
  }

  dispose(): void {
    this._resize.disconnect();
    this.clear();
  }

  private _options(metric: string, ranks: number[], logScale: boolean): uPlot.Options {
    const series: uPlot.Series[] = [
      { label: 'step' },
      ...ranks.map(rank => ({
        label: `rank ${rank}`,
        stroke: rankColor(rank),
        width: 1.5,
        spanGaps: true
      })),
      // Dashed and grey so the ranks' own lines stay visible under it.
      {
        label: 'mean',
        stroke: themeColor('--jp-ui-font-color2', '#777'),
        width: 1.5,
        dash: [5, 4],
        spanGaps: true
      }
    ];
    const axisColor = themeColor('--jp-ui-font-color2', '#666');
    const gridColor = themeColor('--jp-border-color2', '#e0e0e0');
    return {
      width: this._width(),
      height: HEIGHT,
      scales: { x: { time: false }, y: logScale ? { distr: 3 } : {} },
      axes: [
        { label: 'step', stroke: axisColor, grid: { stroke: gridColor } },
        { label: metric, stroke: axisColor, grid: { stroke: gridColor }, size: 56 }
      ],
      legend: { show: true, live: false },
      cursor: { drag: { x: true, y: false } },
      series
    };
  }

  private _width(): number {
    return Math.max(200, this.node.clientWidth || 300);
  }

  private _fit(): void {
    if (this._plot && this.node.clientWidth > 0) {
      this._plot.setSize({ width: this._width(), height: HEIGHT });
    }
  }

  private _plot: uPlot | null = null;
  private _history: MetricHistory | null = null;
  private _key = '';
  private _shape = '';
  private _rows = -1;
  private _resize: ResizeObserver;
}
