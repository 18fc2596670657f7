/**
 * The GPU Workbench side panel: the active notebook's kernel, its devices with live memory bars, and the traces
 * its `%%gpu` cells captured, each with buttons for its timeline and its export, and its counters' summary where it
 * recorded counters.
 */
import { CommandRegistry } from '@lumino/commands';
import { Widget } from '@lumino/widgets';

import { formatBytes, formatClock, formatPercent, formatRatio, formatSeconds } from './format';
import { gpuIcon } from './icons';
import { KernelLink } from './link';
import { ICounterDevice, IDevice, ITrace } from './protocol';

/** The command ids the panel's buttons run (registered in index.ts). */
export namespace CommandIDs {
  export const openPanel = 'gpuworkbench:open-panel';
  export const insertTracedCell = 'gpuworkbench:insert-traced-cell';
  export const toggleLive = 'gpuworkbench:toggle-live';
  export const exportLast = 'gpuworkbench:export-last-trace';
  export const exportTrace = 'gpuworkbench:export-trace';
  export const showTimeline = 'gpuworkbench:show-timeline';
  export const loadExtension = 'gpuworkbench:load-extension';
}

const LOAD_LINE = '%load_ext gpuworkbench';

function element<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className = '',
  text = ''
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (className) {
    node.className = className;
  }
  if (text) {
    node.textContent = text;
  }
  return node;
}

export class WorkbenchPanel extends Widget {
  constructor(private readonly _commands: CommandRegistry) {
    super();
    this.id = 'gpuworkbench-panel';
    this.addClass('jp-gpuwb-Panel');
    this.title.icon = gpuIcon;
    this.title.caption = 'GPU Workbench';

    const header = element('div', 'jp-gpuwb-header');
    header.append(element('h2', 'jp-gpuwb-title', 'GPU Workbench'), this._context);
    this._notice.setAttribute('aria-live', 'polite');

    const devicesHead = element('h3', 'jp-gpuwb-section-title', 'Devices');
    this._devicesSection.append(devicesHead, this._deviceList);

    const tracesHead = element('div', 'jp-gpuwb-section-head');
    tracesHead.append(this._tracesTitle, this._liveButton, this._exportButton);
    this._liveButton.addEventListener('click', () => void this._commands.execute(CommandIDs.toggleLive));
    this._exportButton.addEventListener('click', () => void this._commands.execute(CommandIDs.exportLast));
    this._tracesSection.append(tracesHead, this._traceTable);

    this.node.append(header, this._notice, this._devicesSection, this._tracesSection);
    this._render(false);
  }

  /** Follow `link` (the active notebook's kernel), or nothing; `context` names the notebook. */
  setTarget(link: KernelLink | null, context: string): void {
    if (this._link !== link) {
      this._link?.changed.disconnect(this._onChanged, this);
      this._link = link;
      link?.changed.connect(this._onChanged, this);
    }
    this._contextText = context;
    this._render(false);
  }

  get link(): KernelLink | null {
    return this._link;
  }

  private _onChanged(_: KernelLink, change: { memoryOnly: boolean }): void {
    this._render(change.memoryOnly);
  }

  private _render(memoryOnly: boolean): void {
    const link = this._link;
    this._context.textContent = this._contextText || 'No notebook';
    const ready = link !== null && link.status === 'ready';
    this._devicesSection.hidden = !ready;
    this._tracesSection.hidden = !ready;
    this._renderNotice(link);
    if (!ready) {
      this._shownTraces = null;
      return;
    }
    this._renderDevices(link.devices);
    if (!memoryOnly) {
      this._liveButton.textContent = link.live ? 'Stop live dashboard' : 'Live dashboard';
      this._liveButton.title = link.live ? 'Insert and run %gpu live stop' : 'Insert and run a %gpu live cell';
      this._exportButton.disabled = link.traces.length === 0;
      if (this._shownTraces !== link.traces) {
        this._renderTraces(link.traces);
        this._shownTraces = link.traces;
      }
    }
  }

  /** Rebuild the notice only when what it says changes, so that its button never moves under a click. */
  private _renderNotice(link: KernelLink | null): void {
    const key = `${this._contextText === ''}:${link === null ? 'none' : link.status}`;
    if (key === this._noticeKey) {
      return;
    }
    this._noticeKey = key;
    const notice = this._notice;
    notice.replaceChildren();
    notice.hidden = false;
    if (this._contextText === '') {
      notice.append(element('p', '', 'Open a notebook: this panel shows the devices and traces of its kernel.'));
      return;
    }
    if (link === null || link.status === 'dead') {
      notice.append(element('p', '', 'This notebook has no running kernel. Start one, then load gpuworkbench in it:'));
      notice.append(element('code', 'jp-gpuwb-code', LOAD_LINE));
      return;
    }
    if (link.status === 'ready') {
      notice.hidden = true;
      return;
    }
    const checking = link.status === 'checking';
    notice.append(
      element('p', '', checking ? 'Looking for gpuworkbench in the kernel…' : 'gpuworkbench is not loaded in this kernel.'),
      element('p', '', 'Run this in a cell to load it:'),
      element('code', 'jp-gpuwb-code', LOAD_LINE)
    );
    const load = element('button', 'jp-gpuwb-button jp-mod-accept', 'Insert and run it');
    load.addEventListener('click', () => void this._commands.execute(CommandIDs.loadExtension));
    notice.append(load);
  }

  /** Update the device rows in place, so that a memory sample every half second does not rebuild the list. */
  private _renderDevices(devices: readonly IDevice[]): void {
    const seen = new Set<string>();
    for (const device of devices) {
      seen.add(device.id);
      let row = this._deviceRows.get(device.id);
      if (!row) {
        row = this._deviceRow();
        this._deviceRows.set(device.id, row);
      }
      this._fillDevice(row, device);
      this._deviceList.append(row); // keeps the kernel's order
    }
    for (const [id, row] of this._deviceRows) {
      if (!seen.has(id)) {
        row.remove();
        this._deviceRows.delete(id);
      }
    }
    if (devices.length === 0) {
      // The CPU backend is always there: an empty list means the kernel has not listed its devices yet (it does so
      // between cells, and lists the ones a running cell opens as it opens them).
      this._deviceList.replaceChildren(element('li', 'jp-gpuwb-empty', 'Listing devices when the kernel is idle…'));
    } else {
      this._deviceList.querySelector(':scope > .jp-gpuwb-empty')?.remove();
    }
  }

  private _deviceRow(): HTMLLIElement {
    const row = element('li', 'jp-gpuwb-device');
    const head = element('div', 'jp-gpuwb-device-head');
    head.append(
      element('span', 'jp-gpuwb-badge'),
      element('span', 'jp-gpuwb-device-id'),
      element('span', 'jp-gpuwb-device-name')
    );
    const bar = element('div', 'jp-gpuwb-bar');
    bar.setAttribute('role', 'meter');
    bar.setAttribute('aria-valuemin', '0');
    bar.append(element('div', 'jp-gpuwb-bar-fill'));
    row.append(head, bar, element('div', 'jp-gpuwb-memory'));
    return row;
  }

  private _fillDevice(row: HTMLLIElement, device: IDevice): void {
    row.dataset.deviceId = device.id;
    row.classList.toggle('jp-mod-current', device.current);
    const [badge, id, name] = Array.from(row.querySelectorAll('.jp-gpuwb-device-head > span'));
    badge.textContent = device.is_gpu ? 'GPU' : 'CPU';
    badge.classList.toggle('jp-mod-gpu', device.is_gpu);
    id.textContent = device.current ? `${device.id} (current)` : device.id;
    name.textContent = device.name;
    name.setAttribute('title', `${device.backend} backend: ${device.name}`);

    const bar = row.querySelector('.jp-gpuwb-bar') as HTMLElement;
    const fill = bar.firstElementChild as HTMLElement;
    const text = row.querySelector('.jp-gpuwb-memory') as HTMLElement;
    const { used, total } = device;
    const known = used !== null && total !== null && total > 0;
    const fraction = known ? Math.min(Math.max(used / total, 0), 1) : 0;
    bar.classList.toggle('jp-mod-unknown', !known);
    bar.classList.toggle('jp-mod-high', known && fraction > 0.9);
    fill.style.width = `${(fraction * 100).toFixed(1)}%`;
    bar.setAttribute('aria-valuemax', String(total ?? 0));
    bar.setAttribute('aria-valuenow', String(used ?? 0));
    if (!known) {
      text.textContent = `${formatBytes(total)} total · open it in this kernel to see its use`;
    } else if (device.used_known) {
      text.textContent = `${formatBytes(used)} used of ${formatBytes(total)}`;
    } else {
      text.textContent = `${formatBytes(used)} held by gpuworkbench of ${formatBytes(total)} (free memory unknown)`;
    }
    bar.setAttribute('aria-label', `${device.id} memory: ${text.textContent}`);
  }

  private _renderTraces(traces: readonly ITrace[]): void {
    this._tracesTitle.textContent = `Traces (${traces.length})`;
    const table = this._traceTable;
    table.replaceChildren();
    if (traces.length === 0) {
      const empty = element('p', 'jp-gpuwb-empty', 'No trace yet: run a cell that starts with %%gpu.');
      const insert = element('button', 'jp-gpuwb-button', 'Insert a %%gpu cell');
      insert.addEventListener('click', () => void this._commands.execute(CommandIDs.insertTracedCell));
      table.append(empty, insert);
      return;
    }
    for (let i = traces.length - 1; i >= 0; i--) {
      table.append(this._traceRow(traces[i], i > 0 ? traces[i - 1] : null));
    }
  }

  private _traceRow(trace: ITrace, before: ITrace | null): HTMLElement {
    const row = element('div', 'jp-gpuwb-trace');
    row.dataset.traceId = String(trace.id);
    row.tabIndex = 0;
    row.setAttribute('role', 'button');
    const cellLabel = trace.cell === null ? `#${trace.id}` : `[${trace.cell}]`;
    row.title = `Show the timeline of ${cellLabel}${trace.name ? ` (${trace.name})` : ''}: ${trace.spans} spans`;
    if (trace.error) {
      row.classList.add('jp-mod-error');
      row.title += `\nthe cell raised ${trace.error}`;
    }
    const figures = element(
      'span',
      'jp-gpuwb-trace-figures',
      `${formatSeconds(trace.wall_s)} · overlap ${formatPercent(trace.overlap_pct)} · ` +
        `efficiency ${formatRatio(trace.efficiency)}`
    );
    figures.title =
      "the cell's wall time · share of copy time hidden under kernels · " +
      "pipeline efficiency (the busiest engine's share of the window)";
    row.append(
      element('span', 'jp-gpuwb-trace-cell', trace.name ? `${cellLabel} ${trace.name}` : cellLabel),
      element('span', 'jp-gpuwb-trace-time', formatClock(trace.started))
    );
    const exportButton = element('button', 'jp-gpuwb-icon-button', '⤓');
    exportButton.title = 'Export as Chrome-trace JSON (opens in Perfetto)';
    exportButton.setAttribute('aria-label', `Export trace ${cellLabel}`);
    exportButton.addEventListener('click', event => {
      event.stopPropagation();
      void this._commands.execute(CommandIDs.exportTrace, { traceId: trace.id });
    });
    row.append(exportButton);
    if (before !== null) {
      const beforeLabel = before.cell === null ? `#${before.id}` : `[${before.cell}]`;
      const compareButton = element('button', 'jp-gpuwb-icon-button jp-gpuwb-compare', '⇄');
      compareButton.title = `Compare with ${beforeLabel}, the trace before it: both timelines and what changed`;
      compareButton.setAttribute('aria-label', `Compare trace ${cellLabel} with ${beforeLabel}`);
      compareButton.addEventListener('click', event => {
        event.stopPropagation();
        void this._commands.execute(CommandIDs.showTimeline, { traceId: trace.id, compareWith: before.id });
      });
      row.append(compareButton);
    }
    row.append(figures);
    if (trace.counters && trace.counters.length > 0) {
      row.append(this._counters(trace.counters));
    }
    const open = () => void this._commands.execute(CommandIDs.showTimeline, { traceId: trace.id });
    row.addEventListener('click', open);
    row.addEventListener('keydown', event => {
      if (event.key === 'Enter' || event.key === ' ') {
        event.preventDefault();
        open();
      }
    });
    return row;
  }

  /** A line per device under the headline figures: its counters' means and peaks and what sampled them (in full
   * on hover); a device without counters of its own says so in a few words ("the host's counters"), why on hover. */
  private _counters(devices: readonly ICounterDevice[]): HTMLElement {
    // jp-gpuwb-trace-figures: the figures' full-width row, small and muted; a div, so that its lines wrap
    const block = element('div', 'jp-gpuwb-trace-figures jp-gpuwb-trace-counters');
    for (const device of devices) {
      const line = element('div', 'jp-gpuwb-trace-counter');
      line.dataset.device = device.device;
      if (device.counters.length === 0) {
        line.textContent = `${device.device}: ${device.sampler || device.source || 'no counters'}`;
        line.title = `${device.device} has no counters of its own: ${device.source || 'no source said why'}`;
      } else {
        const readings = device.counters.map(counter => counter.text).join(' · ');
        line.textContent = `${device.device} (${device.sampler || 'unknown source'}): ${readings}`;
        line.title =
          `${device.device}: mean and peak over the trace, sampled by ${device.source || 'an unknown source'}\n` +
          device.counters.map(counter => `${counter.name}: ${counter.samples} samples`).join('\n');
      }
      block.append(line);
    }
    return block;
  }

  private _link: KernelLink | null = null;
  private _contextText = '';
  private _noticeKey = '';
  private _shownTraces: readonly ITrace[] | null = null;
  private _deviceRows = new Map<string, HTMLLIElement>();
  private _context = element('div', 'jp-gpuwb-context');
  private _notice = element('div', 'jp-gpuwb-notice');
  private _devicesSection = element('section', 'jp-gpuwb-devices');
  private _deviceList = element('ul', 'jp-gpuwb-device-list');
  private _tracesSection = element('section', 'jp-gpuwb-traces');
  private _tracesTitle = element('h3', 'jp-gpuwb-section-title', 'Traces');
  private _liveButton = element('button', 'jp-gpuwb-button', 'Live dashboard');
  private _exportButton = element('button', 'jp-gpuwb-button', 'Export last');
  private _traceTable = element('div', 'jp-gpuwb-trace-table');
}
