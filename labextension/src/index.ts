/**
 * Plugin wiring only: build the panel, follow the active notebook's kernel,
 * register commands. State lives in model.ts, the comm in link.ts, drawing
 * in panel/, the commands in commands.ts.
 */
import { ILabShell, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';

import { addCommands } from './commands';
import { ActiveKernelFollower } from './follower';
import { PhalanxPanel } from './panel/panel';
import { KernelSessions } from './sessions';

export { CommandIDs } from './commands';

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'phalanx-lab:panel',
  description:
    'Side panel for phalanx: cluster, per-rank progress, loss curves, learning networks.',
  autoStart: true,
  requires: [INotebookTracker, ILabShell],
  optional: [ICommandPalette],
  activate: (
    app: JupyterFrontEnd,
    notebooks: INotebookTracker,
    shell: ILabShell,
    palette: ICommandPalette | null
  ) => {
    const sessions = new KernelSessions();
    const follower = new ActiveKernelFollower(notebooks, sessions);
    const panel = new PhalanxPanel();
    panel.follow(follower.current);
    follower.changed.connect((_, target) => panel.follow(target));
    shell.add(panel, 'right', { rank: 900 });
    addCommands(app, shell, panel, palette);

    // Closing our comms on unload tells the kernel to stop sending to this page.
    window.addEventListener('pagehide', () => sessions.dispose());
  }
};

export default plugin;
