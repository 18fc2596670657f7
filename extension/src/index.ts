/**
 * gpuworkbench's JupyterLab extension: the GPU Workbench side panel, its commands (palette and notebook toolbar)
 * and the timeline tabs. All data comes from the kernel over the `gpuworkbench` comm (see protocol.ts).
 */
import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette, IThemeManager, MainAreaWidget, Notification } from '@jupyterlab/apputils';
import { DocumentRegistry } from '@jupyterlab/docregistry';
import { INotebookModel, INotebookTracker, NotebookActions, NotebookPanel } from '@jupyterlab/notebook';
import { Kernel } from '@jupyterlab/services';
import { CommandToolbarButton, downloadIcon } from '@jupyterlab/ui-components';
import { CommandRegistry } from '@lumino/commands';
import { DisposableDelegate, IDisposable } from '@lumino/disposable';

import { gpuIcon, liveIcon, timelineIcon } from './icons';
import { KernelLink } from './link';
import { CommandIDs, WorkbenchPanel } from './panel';
import { isExport } from './protocol';
import { TimelineView, createTimeline, timelineId } from './timeline';

const CATEGORY = 'GPU Workbench';

/** One KernelLink per kernel connection of an open notebook, so that a kernel's own comm is caught in the background. */
class Links {
  /** The link to `panel`'s kernel, created on first use; null while the notebook has no kernel. */
  get(panel: NotebookPanel | null): KernelLink | null {
    const kernel = panel?.sessionContext.session?.kernel ?? null;
    if (!kernel || kernel.isDisposed) {
      return null;
    }
    let link = this._links.get(kernel);
    if (!link) {
      link = new KernelLink(kernel);
      this._links.set(kernel, link);
      kernel.disposed.connect(this._forget, this);
    }
    return link;
  }

  private _forget(kernel: Kernel.IKernelConnection): void {
    this._links.get(kernel)?.dispose();
    this._links.delete(kernel);
  }

  private _links = new Map<Kernel.IKernelConnection, KernelLink>();
}

/** Insert a code cell with `source` below the active cell (or at the top) and, when `run`, run it. */
async function insertCell(panel: NotebookPanel, source: string, where: 'below' | 'top', run: boolean): Promise<void> {
  const notebook = panel.content;
  if (where === 'top') {
    notebook.activeCellIndex = 0;
    NotebookActions.insertAbove(notebook);
  } else {
    NotebookActions.insertBelow(notebook);
  }
  NotebookActions.changeCellType(notebook, 'code');
  const cell = notebook.activeCell;
  if (!cell) {
    return;
  }
  cell.model.sharedModel.setSource(source);
  if (run) {
    await NotebookActions.run(notebook, panel.sessionContext);
  } else {
    await cell.ready;
    notebook.mode = 'edit';
    // Entering edit mode focuses the editor on the next frame, which would put the cursor back at the start.
    await new Promise<void>(resolve => requestAnimationFrame(() => resolve()));
    cell.editor?.setCursorPosition({ line: 1, column: 0 });
  }
}

/** The GPU Workbench buttons on every notebook's toolbar. */
class ToolbarButtons implements DocumentRegistry.IWidgetExtension<NotebookPanel, INotebookModel> {
  constructor(private readonly _commands: CommandRegistry) {}

  createNew(panel: NotebookPanel): IDisposable {
    const ids = [CommandIDs.insertTracedCell, CommandIDs.toggleLive, CommandIDs.exportLast];
    const buttons = ids.map(id => new CommandToolbarButton({ commands: this._commands, id, label: '' }));
    buttons.forEach((button, i) => panel.toolbar.insertItem(10 + i, `gpuworkbench-${i}`, button));
    return new DisposableDelegate(() => buttons.forEach(button => button.dispose()));
  }
}

function activate(
  app: JupyterFrontEnd,
  tracker: INotebookTracker,
  palette: ICommandPalette | null,
  restorer: ILayoutRestorer | null,
  themes: IThemeManager | null
): void {
  const { commands, shell } = app;
  const links = new Links();
  const panel = new WorkbenchPanel(commands);
  shell.add(panel, 'right', { rank: 600 });
  restorer?.add(panel, panel.id);

  const current = (): NotebookPanel | null => tracker.currentWidget;
  const currentLink = (): KernelLink | null => links.get(current());
  // The commands' labels and enabled states follow what the current kernel reports.
  let watched: KernelLink | null = null;
  const onLinkChanged = (_: KernelLink, change: { memoryOnly: boolean }): void => {
    if (!change.memoryOnly) {
      commands.notifyCommandChanged();
    }
  };
  const follow = (): void => {
    const notebook = current();
    const link = links.get(notebook);
    if (link !== watched) {
      watched?.changed.disconnect(onLinkChanged);
      watched = link;
      watched?.changed.connect(onLinkChanged);
    }
    panel.setTarget(link, notebook ? notebook.title.label : '');
    commands.notifyCommandChanged();
  };
  tracker.currentChanged.connect(follow);
  tracker.widgetAdded.connect((_, notebook) => {
    const update = (): void => {
      links.get(notebook); // listen to this kernel even while the notebook is in the background
      if (notebook === current()) {
        follow();
      }
    };
    notebook.sessionContext.kernelChanged.connect(update);
    notebook.sessionContext.ready.then(update).catch(() => undefined);
    notebook.title.changed.connect(update);
  });
  const hasTraces = (): boolean => {
    const link = currentLink();
    return link !== null && link.status === 'ready' && link.traces.length > 0;
  };

  const exportTrace = async (traceId: number | null): Promise<void> => {
    const link = currentLink();
    if (!link) {
      return;
    }
    try {
      const result = await link.request('export', { trace: traceId });
      if (!isExport(result)) {
        console.warn('gpuworkbench: ignoring a malformed export reply', result);
        throw new Error('the kernel sent a malformed reply');
      }
      Notification.success(`Trace written to ${result.path} (open it in Perfetto or chrome://tracing)`, {
        autoClose: 10000
      });
    } catch (error) {
      Notification.error(`Export failed: ${(error as Error).message}`, { autoClose: 10000 });
    }
  };

  commands.addCommand(CommandIDs.openPanel, {
    label: 'Show GPU Workbench',
    caption: 'Open the GPU Workbench side panel',
    icon: gpuIcon,
    execute: () => shell.activateById(panel.id)
  });
  commands.addCommand(CommandIDs.insertTracedCell, {
    label: 'Insert a Traced Cell (%%gpu)',
    caption: 'Insert a %%gpu cell below: it traces every copy and kernel and shows the timeline',
    icon: gpuIcon,
    isEnabled: () => current() !== null,
    execute: async () => {
      const notebook = current();
      if (notebook) {
        await insertCell(notebook, '%%gpu\n', 'below', false);
      }
    }
  });
  commands.addCommand(CommandIDs.toggleLive, {
    label: () => (currentLink()?.live ? 'Stop the Live GPU Dashboard' : 'Start the Live GPU Dashboard'),
    caption: 'Insert and run %gpu live (or %gpu live stop when one runs)',
    icon: liveIcon,
    isEnabled: () => current() !== null,
    execute: async () => {
      const notebook = current();
      if (!notebook) {
        return;
      }
      const link = currentLink();
      const loaded = link !== null && link.status === 'ready';
      const source = link?.live ? '%gpu live stop' : loaded ? '%gpu live' : '%load_ext gpuworkbench\n%gpu live';
      await insertCell(notebook, source, 'below', true);
    }
  });
  commands.addCommand(CommandIDs.exportLast, {
    label: 'Export the Last GPU Trace',
    caption: 'Write the last %%gpu trace as Chrome-trace JSON (opens in Perfetto)',
    icon: downloadIcon,
    isEnabled: hasTraces,
    execute: () => exportTrace(null)
  });
  commands.addCommand(CommandIDs.exportTrace, {
    label: 'Export a GPU Trace',
    isEnabled: hasTraces,
    execute: args => exportTrace(typeof args.traceId === 'number' ? args.traceId : null)
  });
  commands.addCommand(CommandIDs.showTimeline, {
    label: 'Show a GPU Trace Timeline',
    icon: timelineIcon,
    isEnabled: hasTraces,
    execute: args => {
      const link = currentLink();
      const last = link?.traces[link.traces.length - 1];
      const traceId = typeof args.traceId === 'number' ? args.traceId : last?.id;
      const compareWith = typeof args.compareWith === 'number' ? args.compareWith : null;
      if (!link || traceId === undefined) {
        return;
      }
      const id = timelineId(link, traceId, compareWith);
      for (const widget of shell.widgets('main')) {
        if (widget.id === id) {
          shell.activateById(id);
          return;
        }
      }
      const labelOf = (id: number) => {
        const trace = link.traces.find(t => t.id === id);
        return trace?.cell !== null && trace?.cell !== undefined ? `[${trace.cell}]` : `#${id}`;
      };
      const label = compareWith === null ? labelOf(traceId) : `${labelOf(compareWith)} → ${labelOf(traceId)}`;
      shell.add(createTimeline(link, traceId, label, compareWith), 'main', { mode: 'split-right' });
    }
  });
  commands.addCommand(CommandIDs.loadExtension, {
    label: 'Load gpuworkbench in the Kernel',
    caption: 'Insert and run %load_ext gpuworkbench at the top of the notebook',
    isEnabled: () => current() !== null,
    execute: async () => {
      const notebook = current();
      if (notebook) {
        await insertCell(notebook, '%load_ext gpuworkbench', 'top', true);
      }
    }
  });

  for (const command of [
    CommandIDs.openPanel,
    CommandIDs.insertTracedCell,
    CommandIDs.toggleLive,
    CommandIDs.exportLast,
    CommandIDs.loadExtension
  ]) {
    palette?.addItem({ command, category: CATEGORY });
  }
  app.docRegistry.addWidgetExtension('Notebook', new ToolbarButtons(commands));
  // Timelines are drawn by Bokeh in the kernel: draw them again in the new theme's colours.
  themes?.themeChanged.connect((_, change) => {
    const dark = !themes.isLight(change.newValue);
    for (const widget of shell.widgets('main')) {
      if (widget instanceof MainAreaWidget && widget.content instanceof TimelineView) {
        void widget.content.load(dark);
      }
    }
  });
  follow();
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'gpuworkbench:plugin',
  description: "GPU Workbench: the kernel's devices, traces and timelines in a side panel.",
  autoStart: true,
  requires: [INotebookTracker],
  optional: [ICommandPalette, ILayoutRestorer, IThemeManager],
  activate
};

export default plugin;
