/**
 * The messages the kernel (gpuworkbench/notebook/comm.py) and the panel exchange over the `gpuworkbench` comm, and
 * their checks: anything from the kernel that does not match is dropped with a console warning, never thrown.
 */
import { JSONObject } from '@lumino/coreutils';

/** The comm target the kernel registers on `%load_ext gpuworkbench`. */
export const TARGET = 'gpuworkbench';

/** The protocol version this front end speaks; a message with another `v` is ignored. */
export const PROTOCOL_VERSION = 1;

/** One device as the kernel reports it; `used` is null for a device not opened in this kernel. */
export interface IDevice {
  id: string;
  backend: string;
  index: number;
  name: string;
  is_gpu: boolean;
  open: boolean;
  current: boolean;
  used: number | null;
  total: number | null;
  used_known: boolean;
}

/** One counter over a trace: its mean and peak in `unit` (null where no sample had a value), and how it reads. */
export interface ICounter {
  name: string;
  unit: string;
  mean: number | null;
  peak: number | null;
  samples: number;
  text: string;
}

/** One device's counters over a trace ("host" for the host's), and what sampled them: `source` in full, `sampler`
 * its first clause ("NVML GPM, 10 Hz"). A device without counters of its own has none, and `source` says why. */
export interface ICounterDevice {
  device: string;
  source: string;
  sampler: string;
  counters: ICounter[];
}

/** One `%%gpu` cell's trace and its headline figures (null where they do not apply); `counters` is absent or empty
 * for a trace recorded without counters (and from a kernel that predates them). */
export interface ITrace {
  id: number;
  cell: number | null;
  name: string | null;
  started: number | null;
  wall_s: number | null;
  overlap_pct: number | null;
  efficiency: number | null;
  idle_pct: number | null;
  spans: number;
  error: string | null;
  counters?: ICounterDevice[];
}

/** Everything the panel shows about one kernel. */
export interface IState {
  type: 'state';
  version: string;
  devices: IDevice[];
  traces: ITrace[];
  live: boolean;
}

export interface IHello {
  type: 'hello';
  version: string;
}

export interface IMemory {
  type: 'memory';
  devices: IDevice[];
}

export interface IReply {
  type: 'reply';
  id: number | string;
  ok: boolean;
  result?: unknown;
  error?: string;
}

export type KernelMessage = IHello | IState | IMemory | IReply;

/** The result of a `timeline` request. */
export interface ITimeline {
  trace: number;
  title: string;
  html: string;
}

/** The result of an `export` request. */
export interface IExport {
  trace: number;
  path: string;
}

export type Method = 'state' | 'timeline' | 'export';

type Obj = Record<string, unknown>;

const isObject = (v: unknown): v is Obj => typeof v === 'object' && v !== null && !Array.isArray(v);
const isInt = (v: unknown): v is number => typeof v === 'number' && Number.isInteger(v);
const isNumberOrNull = (v: unknown): boolean => v === null || (typeof v === 'number' && Number.isFinite(v));
const isStringOrNull = (v: unknown): boolean => v === null || typeof v === 'string';

function isDevice(v: unknown): v is IDevice {
  return (
    isObject(v) &&
    typeof v.id === 'string' &&
    typeof v.backend === 'string' &&
    isInt(v.index) &&
    typeof v.name === 'string' &&
    typeof v.is_gpu === 'boolean' &&
    typeof v.open === 'boolean' &&
    typeof v.current === 'boolean' &&
    isNumberOrNull(v.used) &&
    isNumberOrNull(v.total) &&
    typeof v.used_known === 'boolean'
  );
}

function isCounter(v: unknown): v is ICounter {
  return (
    isObject(v) &&
    typeof v.name === 'string' &&
    typeof v.unit === 'string' &&
    isNumberOrNull(v.mean) &&
    isNumberOrNull(v.peak) &&
    isInt(v.samples) &&
    typeof v.text === 'string'
  );
}

function isCounterDevice(v: unknown): v is ICounterDevice {
  return (
    isObject(v) &&
    typeof v.device === 'string' &&
    typeof v.source === 'string' &&
    typeof v.sampler === 'string' &&
    Array.isArray(v.counters) &&
    v.counters.every(isCounter)
  );
}

function isTrace(v: unknown): v is ITrace {
  return (
    isObject(v) &&
    isInt(v.id) &&
    (v.cell === null || isInt(v.cell)) &&
    isStringOrNull(v.name) &&
    isNumberOrNull(v.started) &&
    isNumberOrNull(v.wall_s) &&
    isNumberOrNull(v.overlap_pct) &&
    isNumberOrNull(v.efficiency) &&
    isNumberOrNull(v.idle_pct) &&
    isInt(v.spans) &&
    isStringOrNull(v.error) &&
    (v.counters === undefined || (Array.isArray(v.counters) && v.counters.every(isCounterDevice)))
  );
}

/** Why `data` is not a message this front end understands, or null when it is one. */
function problem(data: unknown): string | null {
  if (!isObject(data)) {
    return 'not an object';
  }
  if (data.v !== PROTOCOL_VERSION) {
    return `protocol version ${JSON.stringify(data.v)} (this panel speaks ${PROTOCOL_VERSION})`;
  }
  switch (data.type) {
    case 'hello':
      return typeof data.version === 'string' ? null : 'hello without a version';
    case 'state':
      if (typeof data.version !== 'string' || typeof data.live !== 'boolean') {
        return 'state without version or live';
      }
      if (!Array.isArray(data.devices) || !data.devices.every(isDevice)) {
        return 'state with malformed devices';
      }
      return Array.isArray(data.traces) && data.traces.every(isTrace) ? null : 'state with malformed traces';
    case 'memory':
      return Array.isArray(data.devices) && data.devices.every(isDevice) ? null : 'memory with malformed devices';
    case 'reply':
      if (!(isInt(data.id) || typeof data.id === 'string') || typeof data.ok !== 'boolean') {
        return 'reply without id or ok';
      }
      return data.ok || typeof data.error === 'string' ? null : 'failed reply without an error';
    default:
      return `unknown type ${JSON.stringify(data.type)}`;
  }
}

/** The message in `data`, or null after a console warning when it is malformed, unknown or of another version. */
export function parseKernelMessage(data: unknown): KernelMessage | null {
  const why = problem(data);
  if (why !== null) {
    console.warn(`gpuworkbench: ignoring a message from the kernel: ${why}`, data);
    return null;
  }
  return data as unknown as KernelMessage;
}

/** Whether `result` (a `timeline` reply's result) has the expected shape. */
export function isTimeline(result: unknown): result is ITimeline {
  return isObject(result) && isInt(result.trace) && typeof result.title === 'string' && typeof result.html === 'string';
}

/** Whether `result` (an `export` reply's result) has the expected shape. */
export function isExport(result: unknown): result is IExport {
  return isObject(result) && isInt(result.trace) && typeof result.path === 'string';
}

/** A request to the kernel. */
export function request(id: number, method: Method, params: JSONObject = {}): JSONObject {
  return { v: PROTOCOL_VERSION, type: 'request', id, method, params };
}
