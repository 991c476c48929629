/**
 * The loss chart: one uPlot instance, one line per rank plus the mean. The
 * plot is rebuilt only when its series or scale change; new rows just
 * replace the data. Every line holds a bounded number of points (the
 * history downsamples as rows arrive), so a redraw costs the same on the
 * first day of a run as on the third.
 *
 * Dragging across the plot zooms: the chart asks the kernel for that step
 * window (through `onZoom`) and draws it at full resolution when the answer
 * arrives; a double click or "full view" returns to the whole run.
 */
import uPlot from 'uplot';

import { alignSeries } from '../chartdata';
import { MetricHistory } from '../history';
import type { IHistoryWindow } from '../model';

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

/** Called with the step window a person dragged across. */
export type ZoomRequest = (start: number, end: number) => void;

export class LossChart {
  constructor(private readonly _onZoom: ZoomRequest = () => undefined) {
    this.node = document.createElement('div');
    this.node.className = 'jp-Phalanx-chart';
    this._reset = document.createElement('button');
    this._reset.className = 'jp-Phalanx-button jp-Phalanx-zoomReset';
    this._reset.textContent = 'full view';
    this._reset.title = 'Show the whole run again (or double-click the chart)';
    this._reset.hidden = true;
    this._reset.onclick = () => this.resetZoom();
    this.node.append(this._reset);
    this.node.addEventListener('dblclick', () => this.resetZoom());
    // The sidebar is resized by the user: follow its width.
    this._resize = new ResizeObserver(() => this._fit());
    this._resize.observe(this.node);
  }

  readonly node: HTMLDivElement;

  /**
   * Draw `metric` of `history`, or of `window` while zoomed into the window
   * it answers; cheap when nothing changed.
   */
  draw(
    history: MetricHistory,
    metric: string,
    logScale: boolean,
    window: IHistoryWindow | null = null
  ): void {
    if (history !== this._history) {
      this._zoom = null; // another run
    }
    const shown = this._zoom && window && this._answers(window) ? window : null;
    const source = shown ? shown.history : history;
    const key = `${metric}|${logScale}`;
    const unchanged =
      history === this._history &&
      source === this._source &&
      key === this._key &&
      source.rowCount === this._rows;
    this._last = { history, metric, logScale, window };
    if (unchanged || (this._zoom && !shown && this._plot && history === this._history)) {
      // Nothing new, or zoomed and waiting for the window: keep what is drawn.
      return;
    }
    const columns = alignSeries(source.series(metric), logScale, source.mean(metric));
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
    this._source = source;
    this._key = key;
    this._rows = source.rowCount;
    this._describe(source, metric, shown);
  }

  /** Number of x points drawn (tests read it through the DOM's data attribute). */
  get points(): number {
    return this._plot?.data[0]?.length ?? 0;
  }

  /** Back to the whole run. */
  resetZoom(): void {
    if (!this._zoom) {
      return;
    }
    this._zoom = null;
    this._source = null;
    const last = this._last;
    if (last) {
      this.draw(last.history, last.metric, last.logScale, last.window);
    }
  }

  clear(): void {
    this._plot?.destroy();
    this._plot = null;
    this._history = null;
    this._source = null;
    this._zoom = null;
    this._shape = '';
    this._describe(null, '', null);
  }

  dispose(): void {
    this._resize.disconnect();
    this.clear();
  }

  private _answers(window: IHistoryWindow): boolean {
    return !!this._zoom && window.start === this._zoom[0] && window.end === this._zoom[1];
  }

  /** What the chart shows, for people (the reset button) and tests (data attributes). */
  private _describe(
    source: MetricHistory | null,
    metric: string,
    shown: IHistoryWindow | null
  ): void {
    const data = this.node.dataset;
    data.linePoints = String(source ? source.maxLinePoints(metric) : 0);
    data.range = source ? source.stepRange(metric).join(',') : '';
    let max = -Infinity;
    for (const line of source?.series(metric).values() ?? []) {
      for (const value of line.values) {
        max = value > max ? value : max;
      }
    }
    data.max = Number.isFinite(max) ? String(max) : '';
    data.log = String(this._key.endsWith('|true'));
    if (shown) {
      data.zoom = `${shown.start},${shown.end}`;
    } else {
      delete data.zoom;
    }
    this._reset.hidden = !this._zoom;
  }

  private _onSelect(u: uPlot): void {
    const { left, width } = u.select;
    if (width < 2) {
      return;
    }
    const start = Math.ceil(u.posToVal(left, 'x'));
    const end = Math.floor(u.posToVal(left + width, 'x'));
    if (end < start) {
      return;
    }
    this._zoom = [start, end];
    this._reset.hidden = false;
    this._onZoom(start, end);
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
        {
          label: 'step',
          stroke: axisColor,
          grid: { stroke: gridColor },
          values: (_u: uPlot, splits: number[]) => this._stepLabels(splits)
        },
        { label: metric, stroke: axisColor, grid: { stroke: gridColor }, size: 56 }
      ],
      legend: { show: true, live: false },
      cursor: { drag: { x: true, y: false } },
      hooks: { setSelect: [u => this._onSelect(u)] },
      series
    };
  }

  /** uPlot's own labels, counted: tests read how many ticks a narrow chart keeps. */
  private _stepLabels(splits: number[]): string[] {
    const labels = splits.map(v => (v === null || v === undefined ? '' : uPlot.fmtNum(v)));
    this.node.dataset.xTicks = String(labels.filter(l => l !== '').length);
    return labels;
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
  private _source: MetricHistory | null = null;
  private _zoom: [number, number] | null = null;
  private _last: {
    history: MetricHistory;
    metric: string;
    logScale: boolean;
    window: IHistoryWindow | null;
  } | null = null;
  private _reset: HTMLButtonElement;
  private _key = '';
  private _shape = '';
  private _rows = -1;
  private _resize: ResizeObserver;
}
