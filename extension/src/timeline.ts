/**
 * A main-area tab with one trace's timeline: the kernel renders it as a standalone Bokeh page (BokehJS inline, so
 * it works offline), shown in a sandboxed iframe that may run scripts but cannot reach the Lab page.
 */
import { MainAreaWidget } from '@jupyterlab/apputils';
import { IFrame } from '@jupyterlab/ui-components';
import { JSONObject } from '@lumino/coreutils';
import { Widget } from '@lumino/widgets';

import { timelineIcon } from './icons';
import { KernelLink } from './link';
import { isTimeline } from './protocol';

export class TimelineView extends Widget {
  constructor(
    readonly link: KernelLink,
    readonly traceId: number,
    readonly compareWith: number | null = null
  ) {
    super();
    this.addClass('jp-gpuwb-Timeline');
    this._status.className = 'jp-gpuwb-timeline-status';
    this._frame.addClass('jp-gpuwb-timeline-frame');
    this.node.append(this._status, this._frame.node);
  }

  /**
   * Ask the kernel for the trace's page, in Bokeh's dark theme when `dark` (default: Lab's current theme), and
   * show it; a failure is shown in the tab. Resolves with the page's title, or null.
   */
  async load(dark: boolean = document.body.dataset.jpThemeLight === 'false'): Promise<string | null> {
    this._status.textContent = 'The kernel is drawing the timeline… (it waits for a running cell to finish)';
    this._status.hidden = false;
    try {
      const params: JSONObject = { trace: this.traceId, dark };
      if (this.compareWith !== null) {
        params.compare = this.compareWith;
      }
      const result = await this.link.request('timeline', params);
      if (!isTimeline(result)) {
        console.warn('gpuworkbench: ignoring a malformed timeline reply', result);
        throw new Error('the kernel sent a malformed timeline');
      }
      const iframe = this._frame.node.querySelector('iframe') as HTMLIFrameElement;
      iframe.srcdoc = result.html;
      this._status.hidden = true;
      return result.title;
    } catch (error) {
      this._status.textContent = `No timeline: ${(error as Error).message}`;
      return null;
    }
  }

  private _status = document.createElement('div');
  private _frame = new IFrame({ sandbox: ['allow-scripts'], referrerPolicy: 'no-referrer' });
}

/** The id of the tab showing trace `traceId` (beside trace `compareWith`, when not null). */
export function timelineId(link: KernelLink, traceId: number, compareWith: number | null = null): string {
  const base = `gpuworkbench-timeline-${link.kernel.id}-${traceId}`;
  return compareWith === null ? base : `${base}-vs-${compareWith}`;
}

/**
 * A new tab for trace `traceId` of `link`'s kernel (compared with trace `compareWith`: both timelines on one axis
 * and what changed, when not null); its content loads in the background.
 */
export function createTimeline(
  link: KernelLink,
  traceId: number,
  label: string,
  compareWith: number | null = null
): MainAreaWidget<TimelineView> {
  const view = new TimelineView(link, traceId, compareWith);
  const widget = new MainAreaWidget({ content: view });
  widget.id = timelineId(link, traceId, compareWith);
  widget.addClass('jp-gpuwb-TimelineTab');
  widget.title.label = compareWith === null ? `Timeline ${label}` : `Compare ${label}`;
  widget.title.icon = timelineIcon;
  widget.title.closable = true;
  void view.load().then(title => {
    if (title) {
      widget.title.label = compareWith === null ? `Timeline: ${title}` : `Compare: ${title}`;
    }
  });
  return widget;
}
