/** The extension's icons, drawn in Lab's icon colour so that they follow the light and dark themes. */
import { LabIcon } from '@jupyterlab/ui-components';

const chip = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <path d="M7 5h10a2 2 0 0 1 2 2v10a2 2 0 0 1-2 2H7a2 2 0 0 1-2-2V7a2 2 0 0 1 2-2zm0 2v10h10V7H7z"/>
    <rect x="9" y="9" width="6" height="6"/>
    <path d="M8 1h2v3H8zm6 0h2v3h-2zM8 20h2v3H8zm6 0h2v3h-2zM1 8h3v2H1zm0 6h3v2H1zm19-6h3v2h-3zm0 6h3v2h-3z"/>
  </g>
</svg>`;

const pulse = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <path class="jp-icon3" stroke="#616161" style="fill: none" stroke-width="2" stroke-linejoin="round"
    d="M2 12h4l3-7 4 14 3-7h6"/>
</svg>`;

const timeline = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <rect x="2" y="4" width="9" height="4"/><rect x="8" y="10" width="12" height="4"/>
    <rect x="4" y="16" width="7" height="4"/><rect x="14" y="16" width="6" height="4"/>
  </g>
</svg>`;

export const gpuIcon = new LabIcon({ name: 'gpuworkbench:chip', svgstr: chip });
export const liveIcon = new LabIcon({ name: 'gpuworkbench:live', svgstr: pulse });
export const timelineIcon = new LabIcon({ name: 'gpuworkbench:timeline', svgstr: timeline });
