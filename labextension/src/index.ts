/**
 * Plugin wiring only: build the panel, follow the active notebook's kernel,
 * register commands. State lives in model.ts, the comm in link.ts, drawing
 * in panel/.
 */
import { ILabShell, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { INotebookTracker } from '@jupyterlab/notebook';

import { ActiveKernelFollower } from './follower';
import { PANEL_ID, PhalanxPanel } from './panel/panel';
import { KernelSessions } from './sessions';

/** Command ids, in one place so menus, palette and tests agree. */
export namespace CommandIDs {
  export const open = 'phalanx:open-panel';
  export const refresh = 'phalanx:refresh';
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'phalanx-lab:panel',
  description:
    'Side panel for phalanx: cluster, per-rank progress, loss curves, learning networks.',
  autoStart: true,
  requires: [INotebookTracker, ILabShell],
  activate: (app: JupyterFrontEnd, notebooks: INotebookTracker, shell: ILabShell) => {
    const sessions = new KernelSessions();
    const follower = new ActiveKernelFollower(notebooks, sessions);
    const panel = new PhalanxPanel();
    panel.follow(follower.current);
    follower.changed.connect((_, target) => panel.follow(target));
    shell.add(panel, 'right', { rank: 900 });

    app.commands.addCommand(CommandIDs.open, {
      label: 'Show the phalanx panel',
      execute: () => shell.activateById(PANEL_ID)
    });
    app.commands.addCommand(CommandIDs.refresh, {
      label: 'Refresh the phalanx panel',
      execute: () => panel.refresh()
    });

    // Closing our comms on unload tells the kernel to stop sending to this page.
    window.addEventListener('pagehide', () => sessions.dispose());
  }
};

export default plugin;
