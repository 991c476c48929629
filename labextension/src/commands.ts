/**
 * The panel's commands, in the command palette under "phalanx". They act on
 * the kernel the panel follows (the current notebook's) through the panel's
 * own controls, so a command sends what the matching button sends and the
 * panel shows the same "stopping…" / "scaling to 3…" until the kernel answers.
 */
import type { ILabShell, JupyterFrontEnd } from '@jupyterlab/application';
import { ICommandPalette, InputDialog } from '@jupyterlab/apputils';

import { PANEL_ID, PhalanxPanel } from './panel/panel';

/** Command ids, in one place so menus, palette and tests agree. */
export namespace CommandIDs {
  export const open = 'phalanx:open-panel';
  export const refresh = 'phalanx:refresh';
  export const stopRun = 'phalanx:stop-run';
  export const scale = 'phalanx:scale';
  export const scaleUp = 'phalanx:scale-up';
  export const scaleDown = 'phalanx:scale-down';
}

export const PALETTE_CATEGORY = 'phalanx';

export function addCommands(
  app: JupyterFrontEnd,
  shell: ILabShell,
  panel: PhalanxPanel,
  palette: ICommandPalette | null
): void {
  const { commands } = app;
  const show = (): void => shell.activateById(PANEL_ID);
  // Scaling is answered in the panel's Cluster section ("scaling to 3…", or why not).
  const scaleBy = (delta: number): void => {
    show();
    panel.scaleBy(delta);
  };
  const canScaleBy = (delta: number): boolean => {
    const s = panel.scaling;
    return s !== null && !s.locked && s.engines + delta >= 1 && s.engines + delta <= s.max;
  };

  commands.addCommand(CommandIDs.open, {
    label: 'Open Panel',
    caption: 'Show the phalanx side panel: cluster, runs, learning networks',
    execute: show
  });
  commands.addCommand(CommandIDs.refresh, {
    label: 'Refresh Panel',
    caption: "Ask the notebook's kernel for its phalanx state again",
    execute: () => panel.refresh()
  });
  commands.addCommand(CommandIDs.stopRun, {
    label: 'Stop Run',
    caption: "Stop the notebook's running %%distributed_fit: every rank stops, the engines stay",
    isEnabled: () => panel.canStopRun,
    execute: () => {
      if (panel.canStopRun) {
        panel.stopRun();
      }
    }
  });
  commands.addCommand(CommandIDs.scale, {
    label: 'Scale Cluster…',
    caption: "Set how many engines the notebook's cluster has",
    isEnabled: () => panel.scaling?.locked === false,
    execute: async () => {
      const s = panel.scaling;
      if (!s || s.locked) {
        return;
      }
      const answer = await InputDialog.getNumber({
        title: 'Scale the phalanx cluster',
        label: `Engines (1 to ${s.max}; now ${s.engines})`,
        value: s.engines
      });
      if (answer.button.accept && answer.value !== null) {
        show();
        panel.scaleTo(answer.value);
      }
    }
  });
  commands.addCommand(CommandIDs.scaleUp, {
    label: 'Add an Engine',
    caption: "One engine more for the notebook's cluster (the panel's +)",
    isEnabled: () => canScaleBy(+1),
    execute: () => scaleBy(+1)
  });
  commands.addCommand(CommandIDs.scaleDown, {
    label: 'Remove an Engine',
    caption: "One engine fewer for the notebook's cluster (the panel's −)",
    isEnabled: () => canScaleBy(-1),
    execute: () => scaleBy(-1)
  });

  for (const command of [
    CommandIDs.open,
    CommandIDs.stopRun,
    CommandIDs.scale,
    CommandIDs.scaleUp,
    CommandIDs.scaleDown,
    CommandIDs.refresh
  ]) {
    palette?.addItem({ command, category: PALETTE_CATEGORY });
  }
}
