/**
 * The webgpu engine's arena on the device (engine.ts ties the engine together). The model hands each kernel
 * Float32Array views of its host arrays. The arena mirrors each host ArrayBuffer it is handed (or, on a
 * SharedArrayBuffer, the range it is told about or handed) by one device buffer at the same byte offsets, so a view
 * names a device range: a kernel binds that range (bind). Each mirror is either host-owned (the host array holds the
 * values: a kernel that reads it uploads the view first) or device-owned (a kernel wrote it: the device holds the
 * values, the host array is stale). A kernel that writes a host-owned mirror first uploads all of it, so what it
 * does not write keeps the host's values. The master weights (weightsAre) are uploaded once after each
 * weightsChanged(), i.e. once per optimizer step; a constant once. Uploads go through the queue after the commands
 * recorded so far are submitted (recorder.ts), so they land in order. settle() is the one readback: the arrays it
 * is asked for (the rank's float64 slot, once a step) and the loss rows of every crossEntropy since the last
 * settle, summed here in float64 in row order, whole and per micro-batch (cut() ends one, and an input read after
 * it is uploaded again). claim() and rangeOf() are bind()'s halves, for a kernel that binds a view in parts (the fold).
 */
import type { DeviceTraffic, SettleOptions, Settled } from "../../kernels";
import { type GpuBuffer, type GpuDevice, MAP_READ, USAGE } from "./device";
import type { Bound, Recorder } from "./recorder";

/** Bytes copied at a time from a SharedArrayBuffer (which writeBuffer does not take) through a bounce buffer. */
const BOUNCE = 1 << 24;

export type HostArray = Float32Array | Int32Array | Float64Array;

/** A device mirror of host bytes [start, end) of one (Shared)ArrayBuffer, at the same offsets. */
export interface Mirror {
  host: ArrayBufferLike;
  start: number;
  end: number;
  gpu: GpuBuffer;
  /** The device holds the values (a kernel wrote them); the host's are stale. */
  onDevice: boolean;
  /** The master weights: read only, uploaded whole when dirty (weightsAre / weightsChanged). */
  weights: boolean;
  /** A constant (constant()): uploaded whole once, then resident. */
  constant: boolean;
  dirty: boolean;
  /** A host-owned input: the byte range uploaded this epoch (since the last settle() or cut()): no second upload. */
  fresh: { epoch: number; lo: number; hi: number } | null;
}

/** What one upload carried (DeviceTraffic's up). */
type UpKind = keyof DeviceTraffic["up"];

export class Arena {
  private readonly mirrors = new WeakMap<ArrayBufferLike, Mirror[]>();
  /** The device's minStorageBufferOffsetAlignment and maxStorageBufferBindingSize. */
  readonly align: number;
  readonly maxBinding: number;
  /**
   * Each crossEntropy call's loss rows since the last settle: its first row of lossBuf, its rows, its targeted, and
   * its micro-batch (the cuts before it since the last settle).
   */
  private losses: { buf: GpuBuffer; at: number; rows: number; targeted: number; micro: number }[] = [];
  /** Micro-batches ended (cut) since the last settle. */
  private cuts = 0;
  /** The crossEntropy rows' losses since the last settle (grown on demand; a replaced one lives until that settle). */
  private lossBuf: GpuBuffer | null = null;
  private lossAt = 0;
  private lossRetired: GpuBuffer[] = [];
  private readonly freed = new FinalizationRegistry<GpuBuffer>((b) => {
    this.rec.retire(b);
    this.rec.forgetGroups(); // a cached bind group may name the freed buffer
  });
  private readonly weightList: Mirror[] = [];
  /** settle() and cut() calls so far: an input uploaded in this epoch is still the host's (kernels.ts: settle). */
  epoch = 0;
  private bounceBuf: Uint8Array | null = null;
  /** Bytes up and down so far (DeviceTraffic; its dispatches are the recorder's). */
  readonly counts: Omit<DeviceTraffic, "dispatches"> = {
    up: { weights: 0, constants: 0, inputs: 0, state: 0 },
    down: { arrays: 0, loss: 0 },
  };

  /** `maxBinding`: a smaller binding limit than the device's (a test's, so that small arrays span several bindings). */
  constructor(
    private readonly device: GpuDevice,
    private readonly rec: Recorder,
    maxBinding?: number,
  ) {
    this.align = device.limits.minStorageBufferOffsetAlignment;
    this.maxBinding = Math.min(maxBinding ?? Infinity, device.limits.maxStorageBufferBindingSize);
  }

  /** The mirror whose range holds view a (made now, unless `create` is false), or null. */
  mirrorOf(a: HostArray, create = true): Mirror | null {
    const host = a.buffer,
      lo = a.byteOffset,
      hi = lo + a.byteLength;
    let list = this.mirrors.get(host);
    const found = list?.find((m) => m.start <= lo && hi <= m.end);
    if (found || !create) return found ?? null;
    // a plain ArrayBuffer is mirrored whole; a SharedArrayBuffer (the trainer's shared memory) only where handed
    const whole = !(host instanceof SharedArrayBuffer) && !list?.length;
    const [start, end] = whole ? [0, host.byteLength] : [lo, hi];
    if (list?.some((m) => m.start < end && start < m.end))
      throw new Error(`webgpu: a view of bytes [${lo}, ${hi}) overlaps a mirrored range without lying inside it`);
    const gpu = this.device.createBuffer({
      size: Math.max(4, end - start),
      usage: USAGE.STORAGE | USAGE.COPY_SRC | USAGE.COPY_DST,
    });
    const m: Mirror = {
      host,
      start,
      end,
      gpu,
      onDevice: false,
      weights: false,
      constant: false,
      dirty: true,
      fresh: null,
    };
    if (!list) this.mirrors.set(host, (list = []));
    list.push(m);
    this.freed.register(host, gpu);
    return m;
  }

  /**
   * Host bytes [lo, hi) into the mirror. The commands recorded so far are submitted first and the bytes are written
   * through the queue, so they land after those kernels and before the ones recorded next; no buffer is made.
   */
  private upload(m: Mirror, lo: number, hi: number, kind: UpKind): void {
    if (hi <= lo) return;
    this.rec.submit();
    const q = this.device.queue;
    if (m.host instanceof SharedArrayBuffer) {
      // writeBuffer takes no SharedArrayBuffer: through a reused bounce buffer, BOUNCE bytes at a time
      this.bounceBuf ??= new Uint8Array(BOUNCE);
      for (let at = lo; at < hi; at += BOUNCE) {
        const n = Math.min(BOUNCE, hi - at),
          b = this.bounceBuf.subarray(0, n);
        b.set(new Uint8Array(m.host, at, n));
        q.writeBuffer(m.gpu, at - m.start, b);
      }
    } else q.writeBuffer(m.gpu, lo - m.start, new Uint8Array(m.host, lo, hi - lo));
    this.counts.up[kind] += hi - lo;
  }

  /** The device range of view a for a kernel that reads ("r"), writes ("w") or does both ("rw"). */
  bind(a: HostArray, mode: "r" | "w" | "rw"): Bound {
    return this.rangeOf(this.claim(a, mode), a.byteOffset, a.byteOffset + a.byteLength);
  }

  /**
   * The mirror of view a, made ready for a kernel that reads ("r"), writes ("w") or does both ("rw") all of a: what
   * it reads uploaded, unless the device holds it; then device-owned if it writes. bind() is this and rangeOf.
   */
  claim(a: HostArray, mode: "r" | "w" | "rw"): Mirror {
    const m = this.mirrorOf(a) as Mirror;
    const lo = a.byteOffset,
      hi = lo + a.byteLength;
    if (m.weights || m.constant) {
      if (mode !== "r")
        throw new Error(`webgpu: a kernel was asked to write ${m.weights ? "the master weights" : "a constant"}`);
      if (m.dirty) {
        this.upload(m, m.start, m.end, m.weights ? "weights" : "constants");
        m.dirty = false;
      }
    } else if (!m.onDevice) {
      if (mode === "w" && lo === m.start && hi === m.end)
        m.onDevice = true; // the kernel writes all of it
      else if (mode !== "r") {
        this.upload(m, m.start, m.end, "state"); // what the kernel leaves alone keeps the host's values
        m.onDevice = true;
      } else if (!(m.fresh?.epoch === this.epoch && m.fresh.lo <= lo && hi <= m.fresh.hi)) {
        // an input (token ids, targets): once between settles, however many kernels read it
        this.upload(m, lo, hi, "inputs");
        m.fresh = { epoch: this.epoch, lo, hi };
      }
    }
    return m;
  }

  /**
   * Host bytes [lo, hi) of mirror m as an operand: the binding starts at the aligned offset at or below lo, and
   * `elem` is lo's 4-byte element inside it (a Float64Array's element 2 * elem words in).
   */
  rangeOf(m: Mirror, lo: number, hi: number): Bound {
    const dev = lo - m.start,
      offset = Math.floor(dev / this.align) * this.align;
    const size = Math.max(4, dev + (hi - lo) - offset);
    this.bindable(size);
    if (offset + size > m.gpu.size) throw new Error("webgpu: an operand's binding runs past its mirror");
    return { buffer: m.gpu, offset, size, elem: (dev - offset) / 4 };
  }

  /** Refuses an operand binding of `size` bytes past the device's maxStorageBufferBindingSize. */
  bindable(size: number): void {
    if (size > this.maxBinding)
      throw new Error(
        `webgpu: a kernel operand of ${size} bytes exceeds this device's maxStorageBufferBindingSize (${this.maxBinding}); use a smaller --micro-batch or --seq-len`,
      );
  }

  /** `floats` of a buffer from byte `offset` (aligned) as an operand, held to bind()'s binding-size limit. */
  own(buffer: GpuBuffer, floats: number, offset = 0): Bound {
    const size = Math.max(4, floats * 4);
    this.bindable(size);
    return { buffer, offset, size, elem: 0 };
  }

  /**
   * x = 0 (DeferredKernels.fill with 0), cleared in the command stream: no dispatch, no binding (any size), and a
   * whole host-owned array (a rank's gradient arrays at start) never uploaded.
   */
  clear(x: Float32Array): void {
    const m = this.claim(x, "w");
    const offset = x.byteOffset - m.start;
    this.rec.copyEncoder().clearBuffer(m.gpu, offset, x.byteLength);
  }

  /**
   * The master weights (Kernels.weightsAre): a read-only mirror, uploaded whole before its first read after a change.
   */
  weightsAre(params: Float32Array): void {
    const list = this.mirrors.get(params.buffer) ?? [];
    const lo = params.byteOffset,
      hi = lo + params.byteLength;
    let m = list.find((x) => x.start === lo && x.end === hi) ?? null;
    if (!m) {
      if (list.some((x) => x.start < hi && lo < x.end))
        throw new Error("webgpu: weightsAre on a range that overlaps another mirrored range");
      const gpu = this.device.createBuffer({
        size: Math.max(4, hi - lo),
        usage: USAGE.STORAGE | USAGE.COPY_SRC | USAGE.COPY_DST,
      });
      m = {
        host: params.buffer,
        start: lo,
        end: hi,
        gpu,
        onDevice: false,
        weights: true,
        constant: false,
        dirty: true,
        fresh: null,
      };
      list.push(m);
      this.mirrors.set(params.buffer, list);
      this.freed.register(params.buffer, gpu);
    }
    if (m.onDevice) throw new Error("webgpu: weightsAre on an array a kernel wrote");
    m.weights = true;
    m.dirty = true;
    if (!this.weightList.includes(m)) this.weightList.push(m);
  }

  /** A host array that never changes again: its mirror is uploaded whole before its first read, then kept. */
  constant(a: Float32Array): void {
    const m = this.mirrorOf(a) as Mirror;
    if (m.weights) throw new Error("webgpu: constant() on the master weights");
    if (m.onDevice) throw new Error("webgpu: constant() on an array a kernel wrote");
    if (!m.constant) {
      m.constant = true;
      m.dirty = true;
    }
  }

  /**
   * `rows` floats of the loss buffer for one crossEntropy call of `targeted` targeted rows, read back at settle (the
   * buffer grows; a replaced one lives until settle).
   */
  lossRows(rows: number, targeted: number): Bound {
    const need = (this.lossAt + rows) * 4;
    if (!this.lossBuf || this.lossBuf.size < need) {
      if (this.lossBuf) this.lossRetired.push(this.lossBuf);
      this.lossBuf = this.device.createBuffer({
        size: Math.max(1 << 16, 2 * need),
        usage: USAGE.STORAGE | USAGE.COPY_SRC,
      });
      this.lossAt = 0;
    }
    const at = this.lossAt;
    this.lossAt += rows;
    // the binding starts at an aligned offset; the shader's oL is the row's element inside it
    const offset = Math.floor((at * 4) / this.align) * this.align;
    const size = Math.max(4, at * 4 + rows * 4 - offset);
    this.bindable(size);
    this.losses.push({ buf: this.lossBuf, at, rows, targeted, micro: this.cuts }); // settle reads them from row `at`
    return { buffer: this.lossBuf, offset, size, elem: (at * 4 - offset) / 4 };
  }

  /**
   * Ends a micro-batch (DeferredKernels.endMicroBatch): the loss rows since the previous cut are its loss at the next
   * settle, and an input is uploaded again when a kernel next reads it (a new epoch).
   */
  cut(): void {
    this.cuts++;
    this.epoch++;
  }

  /** Every weights mirror re-uploads before its next read (a WeakMap cannot be walked: they are listed). */
  weightsChanged(): void {
    for (const m of this.weightList) m.dirty = true;
  }

  /**
   * Submits everything queued and resolves once it has run: each array of `readback` that a kernel wrote is read
   * into host memory, and the mean loss of the crossEntropy rows since the last settle. With `clear`, each such
   * array is then zeroed on the device and stays device-owned (kernels.ts). The host may go on recording kernels
   * before it resolves: the readback is in the command stream, so it sees the kernels before it and none after.
   */
  async settle(readback: HostArray[], opts: SettleOptions = {}): Promise<Settled> {
    this.epoch++;
    const cuts = this.cuts;
    this.cuts = 0;
    const jobs: { m: Mirror; staging: GpuBuffer }[] = [];
    const seen = new Set<Mirror>();
    for (const a of readback) {
      const m = this.mirrorOf(a, false);
      if (!m || seen.has(m)) continue;
      seen.add(m);
      if (m.onDevice) {
        const staging = this.rec.stagingOf(Math.max(4, m.end - m.start));
        this.rec.copyEncoder().copyBufferToBuffer(m.gpu, 0, staging, 0, m.end - m.start);
        this.counts.down.arrays += m.end - m.start;
        jobs.push({ m, staging });
      }
      if (opts.clear && !m.weights && !m.constant) {
        this.rec.copyEncoder().clearBuffer(m.gpu);
        m.onDevice = true;
      }
    }
    const losses = this.losses;
    this.losses = [];
    this.lossAt = 0;
    const lossRows = losses.reduce((s, l) => s + l.rows, 0);
    let lossStaging: GpuBuffer | null = null;
    if (lossRows > 0) {
      lossStaging = this.rec.stagingOf(lossRows * 4);
      let at = 0;
      for (const l of losses) {
        this.rec.copyEncoder().copyBufferToBuffer(l.buf, l.at * 4, lossStaging, at, l.rows * 4);
        at += l.rows * 4;
      }
      this.counts.down.loss += lossRows * 4;
    }
    for (const b of this.lossRetired.splice(0)) this.rec.retire(b);
    this.rec.submit();
    const profiled = this.rec.profiled();
    await Promise.all([...jobs.map((j) => j.staging.mapAsync(MAP_READ)), lossStaging?.mapAsync(MAP_READ), ...profiled]);
    if (this.rec.error) throw new Error(`webgpu: ${this.rec.error}`);
    const t0 = performance.now();
    for (const { m, staging } of jobs) {
      new Uint8Array(m.host, m.start, m.end - m.start).set(
        new Uint8Array(staging.getMappedRange(), 0, m.end - m.start),
      );
      staging.unmap();
      this.rec.release(staging);
      if (!opts.clear) m.onDevice = false;
    }
    // the whole loss and each micro-batch's, each summed in row order from its first row
    let sum = 0,
      rows = 0;
    const micros = Math.max(cuts, losses.length ? losses[losses.length - 1].micro + 1 : 0);
    const part = Array.from({ length: micros }, () => ({ sum: 0, targeted: 0 }));
    if (lossStaging) {
      const v = new Float32Array(lossStaging.getMappedRange(), 0, lossRows);
      let at = 0;
      for (const l of losses) {
        const p = part[l.micro];
        for (let i = at; i < at + l.rows; i++) {
          sum += v[i];
          p.sum += v[i];
        }
        at += l.rows;
        p.targeted += l.targeted;
        rows += l.targeted;
      }
      lossStaging.unmap();
      this.rec.release(lossStaging);
    }
    return {
      loss: rows > 0 ? sum / rows : 0,
      rows,
      losses: part.map((p) => (p.targeted > 0 ? p.sum / p.targeted : 0)),
      hostMs: performance.now() - t0,
    };
  }
}
