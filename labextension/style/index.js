// Loaded by JupyterLab through package.json "styleModule"; uPlot's own CSS
// styles its legend and cursor.
import 'uplot/dist/uPlot.min.css';
import './base.css';
