/** Numbers as the panel prints them: bytes, durations, percentages, clock times. */

const UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];

export function formatBytes(n: number | null): string {
  if (n === null) {
    return '?';
  }
  let value = n;
  let unit = 0;
  while (Math.abs(value) >= 1024 && unit < UNITS.length - 1) {
    value /= 1024;
    unit++;
  }
  return `${value.toFixed(unit === 0 || value >= 100 ? 0 : 1)} ${UNITS[unit]}`;
}

export function formatSeconds(s: number | null): string {
  if (s === null) {
    return '–';
  }
  if (s < 1e-3) {
    return `${(s * 1e6).toFixed(0)} µs`;
  }
  if (s < 1) {
    return `${(s * 1e3).toFixed(s < 0.1 ? 1 : 0)} ms`;
  }
  return `${s.toFixed(2)} s`;
}

export function formatPercent(p: number | null): string {
  return p === null ? 'n/a' : `${p.toFixed(0)}%`;
}

export function formatRatio(r: number | null): string {
  return r === null ? 'n/a' : r.toFixed(2);
}

/** A Unix time (seconds) as the local wall-clock time. */
export function formatClock(unixSeconds: number | null): string {
  if (unixSeconds === null) {
    return '–';
  }
  return new Date(unixSeconds * 1000).toLocaleTimeString([], { hour12: false });
}
