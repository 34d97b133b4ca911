// Charts that fit their card: uPlot draws at a fixed pixel width, so a chart takes its
// container's width when it is made and again whenever the container resizes (window
// resizes, a grid reflowing from three columns to one). Sizing charts from the window's width
// instead drew each chart wider than its card (issue 16).
/* global uPlot */

// Distinct on white, in the order runs are picked (Tableau 10).
export const PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948",
  "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"];

const MIN_WIDTH = 120;

// A phone-wide chart is shorter, so that two fit on one screen.
const heightFor = (width) => (width < 480 ? 200 : 240);

export class FittedChart {
  // opts: uPlot's options without width and height; the container must be empty.
  constructor(container, opts, data) {
    this.container = container;
    this.width = this.measure();
    this.plot = new uPlot({ ...opts, width: this.width, height: heightFor(this.width) }, data,
      container);
    this.observer = new ResizeObserver(() => this.fit());
    this.observer.observe(container);
  }

  measure() { return Math.max(MIN_WIDTH, Math.floor(this.container.clientWidth)); }

  fit() {
    // Only the width is ours to follow: the height we set changes the container's, and
    // reacting to that would loop.
    const width = this.measure();
    if (width === this.width || this.container.clientWidth === 0) return;  // unchanged, or hidden
    this.width = width;
    this.plot.setSize({ width, height: heightFor(width) });
  }

  setData(data) { this.plot.setData(data); }

  destroy() {
    this.observer.disconnect();
    this.plot.destroy();
  }
}

// TensorBoard's smoothing: an exponential moving average with weight `w` (0: none, 0.99:
// heavy), debiased so that the first points are not pulled toward zero. Gaps stay gaps.
export function ema(values, w) {
  if (!w) return values;
  let last = 0;
  let n = 0;
  return values.map((v) => {
    if (v === null || v === undefined || !Number.isFinite(v)) return null;
    n += 1;
    last = last * w + (1 - w) * v;
    return last / (1 - w ** n);
  });
}

// One x array and one y array per series, from tables [[x...], [y...]] whose x values differ
// (runs log at their own steps): uPlot's join aligns them, leaving gaps that spanGaps crosses.
export function joinTables(tables) {
  if (!tables.length) return [[]];
  return uPlot.join(tables);
}
