/**
 * The panel's connection to one kernel: finds the gpuworkbench comm (opened by `%load_ext` or by asking the
 * kernel), keeps the devices and traces it pushes, and sends requests.
 */
import { Kernel, KernelMessage as Jmsg } from '@jupyterlab/services';
import { JSONObject } from '@lumino/coreutils';
import { IDisposable } from '@lumino/disposable';
import { ISignal, Signal } from '@lumino/signaling';

import {
  IDevice,
  ITrace,
  KernelMessage,
  Method,
  TARGET,
  parseKernelMessage,
  request
} from './protocol';

/**
 * Where a link stands: `checking` until the kernel answers, `missing` when gpuworkbench is not loaded there,
 * `ready` once the state arrived, `dead` when the kernel is gone.
 */
export type LinkStatus = 'checking' | 'missing' | 'ready' | 'dead';

interface IPending {
  resolve: (result: unknown) => void;
  reject: (error: Error) => void;
}

export class KernelLink implements IDisposable {
  constructor(readonly kernel: Kernel.IKernelConnection) {
    kernel.registerCommTarget(TARGET, (comm, msg) => this._adopt(comm, msg.content.data));
    kernel.statusChanged.connect(this._onStatus, this);
    this.probe();
  }

  /** Emitted when anything the panel shows changed; `memoryOnly` when only memory figures moved. */
  get changed(): ISignal<this, { memoryOnly: boolean }> {
    return this._changed;
  }

  get status(): LinkStatus {
    return this._status;
  }

  get devices(): readonly IDevice[] {
    return this._devices;
  }

  get traces(): readonly ITrace[] {
    return this._traces;
  }

  get live(): boolean {
    return this._live;
  }

  get version(): string {
    return this._version;
  }

  get isDisposed(): boolean {
    return this._disposed;
  }

  /** Ask the kernel whether gpuworkbench is loaded, by opening a comm to its target with a state request. */
  probe(): void {
    if (this._disposed || this.kernel.isDisposed) {
      return;
    }
    this._setStatus(this._comm ? this._status : 'checking');
    let comm: Kernel.IComm;
    try {
      comm = this.kernel.createComm(TARGET);
    } catch (error) {
      console.warn('gpuworkbench: cannot open a comm to the kernel', error);
      this._setStatus('missing');
      return;
    }
    const id = this._nextId++;
    this._watch(comm, id);
    comm.open(request(id, 'state'));
  }

  /** Send `method` to the kernel; resolves with the reply's result, rejects with its error. */
  request(method: Method, params: JSONObject = {}): Promise<unknown> {
    const comm = this._comm;
    if (!comm || comm.isDisposed) {
      return Promise.reject(new Error('gpuworkbench is not loaded in this kernel: run %load_ext gpuworkbench'));
    }
    const id = this._nextId++;
    const reply = new Promise<unknown>((resolve, reject) => this._pending.set(id, { resolve, reject }));
    comm.send(request(id, method, params));
    return reply;
  }

  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    this.kernel.statusChanged.disconnect(this._onStatus, this);
    if (!this.kernel.isDisposed) {
      this.kernel.removeCommTarget(TARGET, () => undefined);
    }
    this._drop('the panel let go of this kernel');
    Signal.clearData(this);
  }

  /** The kernel opened a comm to us (`%load_ext gpuworkbench` ran): make it the link's comm and ask for the state. */
  private _adopt(comm: Kernel.IComm, data: unknown): void {
    const hello = parseKernelMessage(data);
    if (!hello || hello.type !== 'hello') {
      return; // warned; the comm stays unused
    }
    const id = this._nextId++;
    this._watch(comm, id);
    this._use(comm);
    comm.send(request(id, 'state'));
  }

  /** Handle `comm`'s messages; `stateId` is the id of the state request that will make it the link's comm. */
  private _watch(comm: Kernel.IComm, stateId: number): void {
    comm.onMsg = (msg: Jmsg.ICommMsgMsg) => {
      const message = parseKernelMessage(msg.content.data);
      if (message) {
        if (message.type === 'reply' && message.id === stateId && message.ok && comm !== this._comm) {
          this._use(comm);
        }
        if (comm === this._comm) {
          this._handle(message, stateId);
        }
      }
    };
    comm.onClose = () => {
      if (comm === this._comm) {
        this._drop('the kernel closed the gpuworkbench comm');
        this._setStatus(this.kernel.isDisposed ? 'dead' : 'missing');
      } else if (!this._comm && this._status === 'checking') {
        this._setStatus('missing'); // the kernel has no gpuworkbench target
      }
    };
  }

  /** Make `comm` the one comm of this link, closing the one it replaces. */
  private _use(comm: Kernel.IComm): void {
    const old = this._comm;
    if (old === comm) {
      return;
    }
    this._comm = comm;
    if (old && !old.isDisposed) {
      this._rejectAll('the kernel opened a newer gpuworkbench comm');
      old.onClose = () => undefined;
      old.close();
    }
  }

  private _handle(message: KernelMessage, stateId: number): void {
    switch (message.type) {
      case 'state':
        this._applyState(message.devices, message.traces, message.live, message.version);
        break;
      case 'memory':
        this._applyMemory(message.devices);
        break;
      case 'reply': {
        if (message.id === stateId && message.ok) {
          const state = parseKernelMessage({ v: 1, ...(message.result as object) });
          if (state && state.type === 'state') {
            this._applyState(state.devices, state.traces, state.live, state.version);
          }
        }
        const pending = this._pending.get(message.id as number);
        if (pending) {
          this._pending.delete(message.id as number);
          if (message.ok) {
            pending.resolve(message.result);
          } else {
            pending.reject(new Error(message.error ?? 'the kernel refused the request'));
          }
        }
        break;
      }
      case 'hello':
        break;
    }
  }

  private _applyState(devices: IDevice[], traces: ITrace[], live: boolean, version: string): void {
    this._devices = devices;
    this._traces = traces;
    this._live = live;
    this._version = version;
    this._status = 'ready';
    this._changed.emit({ memoryOnly: false });
  }

  /** Merge the open devices' memory into the list; a device not listed yet is added. */
  private _applyMemory(samples: IDevice[]): void {
    let added = false;
    const devices = this._devices.slice();
    for (const sample of samples) {
      const i = devices.findIndex(d => d.id === sample.id);
      if (i < 0) {
        devices.push(sample);
        added = true;
      } else {
        const { used, total, used_known, open } = sample;
        devices[i] = { ...devices[i], used, total, used_known, open };
      }
    }
    this._devices = devices;
    this._changed.emit({ memoryOnly: !added });
  }

  private _onStatus(_: Kernel.IKernelConnection, status: Kernel.Status): void {
    if (status === 'restarting' || status === 'autorestarting') {
      this._drop('the kernel restarted');
      this._restarted = true;
      this._setStatus('missing');
    } else if (status === 'dead') {
      this._drop('the kernel died');
      this._setStatus('dead');
    } else if (status === 'idle' && this._restarted) {
      this._restarted = false;
      this.probe(); // a startup script may have loaded gpuworkbench again
    }
  }

  private _drop(why: string): void {
    const comm = this._comm;
    this._comm = null;
    this._rejectAll(why);
    if (comm && !comm.isDisposed && !this.kernel.isDisposed) {
      comm.onClose = () => undefined;
      try {
        comm.close();
      } catch {
        // the connection is already gone
      }
    }
    this._devices = [];
    this._traces = [];
    this._live = false;
  }

  private _rejectAll(why: string): void {
    for (const pending of this._pending.values()) {
      pending.reject(new Error(why));
    }
    this._pending.clear();
  }

  private _setStatus(status: LinkStatus): void {
    if (status !== this._status) {
      this._status = status;
      this._changed.emit({ memoryOnly: false });
    }
  }

  private _changed = new Signal<this, { memoryOnly: boolean }>(this);
  private _comm: Kernel.IComm | null = null;
  private _devices: IDevice[] = [];
  private _traces: ITrace[] = [];
  private _live = false;
  private _version = '';
  private _status: LinkStatus = 'checking';
  private _nextId = 1;
  private _pending = new Map<number, IPending>();
  private _restarted = false;
  private _disposed = false;
}
