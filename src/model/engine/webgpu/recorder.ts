/**
 * The webgpu engine's command stream (engine.ts ties the engine together): one command encoder and its compute pass,
 * submitted every SUBMIT_EVERY dispatches (the device starts on them while the host records more) and before every
 * upload and readback (arena.ts); the pipelines, one per shader (shaders/catalog.ts), set of its read-only arrays
 * bound read_write (where a dispatch's read-only array shares its buffer with a written one) and pipeline constants
 * (a shader's WGSL `override`s: attention's head size), made in pipeline(): the one place a pipeline is created;
 * each dispatch's settings written once into a uniform slab and its bind group cached
 * by pipeline, operand ranges and settings (a micro-batch repeats the same dispatches); the staging buffers a
 * readback maps; the device's errors; and profile mode, every dispatch in its own pass between two timestamps.
 */
import type { GpuBinding, GpuBuffer, GpuDevice, GpuEncoder, GpuPass, GpuPipeline } from "./device";
import { MAP_READ, USAGE } from "./device";
import { packParams, WG, withWritable } from "./shaders/framework";
import { type ParamsOf, SHADERS, type ShaderName } from "./shaders/catalog";

/** Dispatches recorded before the command stream is submitted (the device starts on them while the host records more). */
const SUBMIT_EVERY = 512;
/** Bytes of one uniform slab (the dispatches' settings, each at an aligned offset, written once and kept). */
const UNIFORM_SLAB = 1 << 16;
/** Cached bind groups before the cache starts again (a run repeats its dispatches; generation's grow with the cache). */
const MAX_GROUPS_CACHED = 1 << 14;
/** Timestamped dispatches resolved at a time, in profile mode. */
const PROFILE_SPAN = 2048;
/** WebGPU's guaranteed workgroups per grid dimension. */
export const MAX_GROUPS = 65535;

/** A pipeline's constants by name: the values of its shader's WGSL `override`s (one pipeline per set). */
export type PipelineConstants = Readonly<Record<string, number>>;

/** A bound operand: the device range of a view and the view's first element inside the binding. */
export interface Bound {
  buffer: GpuBuffer;
  offset: number;
  size: number;
  elem: number;
}

/** A 1-D range of n threads in workgroups of `size`, as a grid. */
export function grid(n: number, size = WG): [number, number] {
  const groups = Math.ceil(n / size);
  if (groups === 0) return [0, 0];
  const x = Math.min(groups, MAX_GROUPS);
  return [x, Math.ceil(groups / x)];
}

/** The recorder's options: profile mode, and a test's replacement WGSL for some shaders (a planted defect). */
export interface RecorderOptions {
  profile?: boolean;
  /** A shader's WGSL replaced (its bindings and settings kept): a test's planted defect. */
  shaders?: Partial<Record<ShaderName, string>>;
}

export class Recorder {
  /** Pipelines by shader, the `read` bindings made writable and pipeline constants (pipeline()); modules by code. */
  private readonly pipelines = new Map<string, GpuPipeline>();
  private readonly modules = new Map<string, unknown>();
  /** A test's replacement WGSL for some shaders (webgpuEngineOn's `shaders`); empty in every run. */
  private readonly code: Partial<Record<ShaderName, string>>;
  private enc: GpuEncoder | null = null;
  private pass: GpuPass | null = null;
  private recorded = 0;
  /** Buffers to destroy once the command stream that uses them is submitted. */
  private temps: GpuBuffer[] = [];
  /** The device's first uncaptured error, or its loss: settle() throws it. */
  error: string | null = null;
  private disposed = false;
  /** Dispatches recorded since the recorder was made (DeviceTraffic's dispatches). */
  dispatches = 0;
  /** Bind groups by pipeline, operand ranges and settings: a micro-batch repeats the same dispatches. */
  private readonly groups = new Map<string, unknown>();
  private readonly bufferIds = new WeakMap<GpuBuffer, number>();
  private nextBufferId = 1;
  /** The uniform slab being filled, and the next free offset in it. */
  private slab: GpuBuffer | null = null;
  private slabAt = UNIFORM_SLAB;
  private readonly slabs: GpuBuffer[] = [];
  private readonly uniformAlign: number;
  /** MAP_READ buffers by size, free for the next readback. */
  private readonly stagingPool = new Map<number, GpuBuffer[]>();
  /** Profile mode: every dispatch in its own timestamped pass, its time added to its shader's total. */
  private readonly prof: {
    set: unknown;
    resolve: GpuBuffer;
    names: string[];
    pending: Promise<void>[];
    totals: Map<string, { calls: number; ms: number }>;
  } | null = null;

  /** `before(name, ops)` runs before each dispatch is recorded (the engine's deferred norms flush there). */
  constructor(
    private readonly device: GpuDevice,
    opts: RecorderOptions,
    private readonly before: (name: ShaderName, ops: Bound[]) => void,
  ) {
    this.code = opts.shaders ?? {};
    this.uniformAlign = device.limits.minUniformBufferOffsetAlignment;
    if (opts.profile) {
      if (!device.features?.has("timestamp-query") || !device.createQuerySet)
        throw new Error("webgpu: the profile needs the adapter's timestamp-query feature, which this one lacks");
      this.prof = {
        set: device.createQuerySet({ type: "timestamp", count: 2 * PROFILE_SPAN }),
        resolve: device.createBuffer({ size: 16 * PROFILE_SPAN, usage: USAGE.QUERY_RESOLVE | USAGE.COPY_SRC }),
        names: [],
        pending: [],
        totals: new Map(),
      };
    }
    device.onuncapturederror = (e) => {
      this.error ??= e.error.message;
    };
    void device.lost.then((l) => {
      if (!this.disposed) this.error ??= `the WebGPU device was lost: ${l.message}`;
    });
  }

  /** The encoder, its compute pass ended: for a copy or clear recorded in the command stream. */
  copyEncoder(): GpuEncoder {
    if (this.pass) {
      this.pass.end();
      this.pass = null;
    }
    this.enc ??= this.device.createCommandEncoder();
    return this.enc;
  }

  /** Submits what is recorded; the buffers retired meanwhile are destroyed (nothing recorded later uses them). */
  submit(): void {
    if (this.pass) {
      this.pass.end();
      this.pass = null;
    }
    const timed = this.prof && this.prof.names.length > 0 ? this.resolveProfile() : null;
    if (this.enc) this.device.queue.submit([this.enc.finish()]);
    timed?.(); // mapped only once the copy into it is submitted
    this.enc = null;
    for (const t of this.temps) t.destroy();
    this.temps = [];
    this.recorded = 0;
  }

  /**
   * Profile mode: the timestamps recorded so far copied into a readback; returns what maps it once submitted, its
   * times then added to each shader's total.
   */
  private resolveProfile(): () => void {
    const prof = this.prof!;
    const names = prof.names;
    prof.names = [];
    const enc = (this.enc ??= this.device.createCommandEncoder());
    enc.resolveQuerySet(prof.set, 0, 2 * names.length, prof.resolve, 0);
    const staging = this.stagingOf(16 * names.length);
    enc.copyBufferToBuffer(prof.resolve, 0, staging, 0, 16 * names.length);
    return () =>
      prof.pending.push(
        staging.mapAsync(MAP_READ).then(() => {
          const t = new BigUint64Array(staging.getMappedRange(), 0, 2 * names.length);
          names.forEach((n, i) => {
            const e = prof.totals.get(n) ?? { calls: 0, ms: 0 };
            e.calls++;
            e.ms += Number(t[2 * i + 1] - t[2 * i]) / 1e6;
            prof.totals.set(n, e);
          });
          staging.unmap();
          this.release(staging);
        }),
      );
  }

  /** A MAP_READ staging buffer of `size` bytes from the pool (release() gives it back). */
  stagingOf(size: number): GpuBuffer {
    const free = this.stagingPool.get(size);
    return free?.pop() ?? this.device.createBuffer({ size, usage: USAGE.MAP_READ | USAGE.COPY_DST });
  }

  /** A staging buffer back into the pool, unmapped. */
  release(b: GpuBuffer): void {
    const list = this.stagingPool.get(b.size) ?? [];
    list.push(b);
    this.stagingPool.set(b.size, list);
  }

  private bufferId(b: GpuBuffer): number {
    let id = this.bufferIds.get(b);
    if (id === undefined) this.bufferIds.set(b, (id = this.nextBufferId++));
    return id;
  }

  /** A place for one dispatch's settings in the uniform slab, written once (its bind group is cached with it). */
  private uniformSlot(bytes: ArrayBuffer): { buffer: GpuBuffer; offset: number } {
    const stride = Math.ceil(bytes.byteLength / this.uniformAlign) * this.uniformAlign;
    if (this.slabAt + stride > UNIFORM_SLAB) {
      this.slab = this.device.createBuffer({ size: UNIFORM_SLAB, usage: USAGE.UNIFORM | USAGE.COPY_DST });
      this.slabs.push(this.slab);
      this.slabAt = 0;
    }
    const offset = this.slabAt;
    this.slabAt += stride;
    this.device.queue.writeBuffer(this.slab!, offset, new Uint8Array(bytes));
    return { buffer: this.slab!, offset };
  }

  /**
   * The pipeline of `name` with its `read` bindings `writable` declared read_write (withWritable: a dispatch binds
   * a read-only array read_write where its device buffer also backs a written array of the same dispatch) and its
   * pipeline constants (WGSL `override`s, such as attention's head size): one per shader, writable set and
   * constants, made once; one shader module per shader and writable set.
   */
  private pipeline(
    name: ShaderName,
    writable: readonly number[],
    constants: PipelineConstants | undefined,
  ): GpuPipeline {
    const moduleKey = `${name}|${writable.join(",")}`;
    const key = constants ? `${moduleKey}|${Object.entries(constants).join(",")}` : moduleKey;
    let p = this.pipelines.get(key);
    if (!p) {
      let module = this.modules.get(moduleKey);
      if (!module) {
        module = this.device.createShaderModule({
          code: withWritable(this.code[name] ?? SHADERS[name].code, writable),
        });
        this.modules.set(moduleKey, module);
      }
      p = this.device.createComputePipeline({
        layout: "auto",
        compute: { module, entryPoint: "main", ...(constants ? { constants: { ...constants } } : {}) },
      });
      this.pipelines.set(key, p);
    }
    return p;
  }

  /**
   * Records one dispatch of `name` over its operands (bindings 0.., one per storage array of the shader) and its
   * settings by name (the uniform, bound last), on a grid of [x, y] workgroups, with the pipeline made for
   * `constants` (the shader's `override`s, if it has any). A missing or unknown setting, or a wrong operand count,
   * throws (packParams).
   */
  dispatch<N extends ShaderName>(
    name: N,
    ops: Bound[],
    params: ParamsOf<N>,
    grid: [number, number] | [number, number, number],
    constants?: PipelineConstants,
  ): void {
    if (this.disposed) throw new Error("webgpu: the engine was disposed");
    const shader = SHADERS[name];
    if (ops.length !== shader.bindings.length)
      throw new Error(
        `webgpu: ${name} binds ${shader.bindings.map((b) => b.split(":")[0]).join(", ")}; given ${ops.length} operands`,
      );
    const bytes = packParams(name, shader, params);
    this.before(name, ops);
    const [gx, gy, gz = 1] = grid;
    if (gx === 0 || gy === 0 || gz === 0) return;
    if (gx > MAX_GROUPS || gy > MAX_GROUPS || gz > MAX_GROUPS)
      throw new Error(`webgpu: ${name} needs a grid of ${gx} x ${gy} x ${gz} workgroups, over ${MAX_GROUPS}`);
    // a read-only array whose device buffer a written array of this dispatch binds too is bound read_write
    const writable: number[] = [];
    ops.forEach((o, i) => {
      if (shader.access[i] === "read" && ops.some((w, j) => shader.access[j] === "read_write" && w.buffer === o.buffer))
        writable.push(i);
    });
    const pipe = this.pipeline(name, writable, constants);
    // the same pipeline, operand ranges and settings as an earlier dispatch: its bind group (and uniform) again
    const key = `${name}|${writable.join(",")}|${constants ? Object.entries(constants).join(",") : ""}|${ops.map((b) => `${this.bufferId(b.buffer)}:${b.offset}:${b.size}`).join(",")}|${new Uint32Array(bytes).join(",")}`;
    let group = this.groups.get(key);
    if (group === undefined) {
      if (this.groups.size >= MAX_GROUPS_CACHED) {
        this.groups.clear();
        this.temps.push(...this.slabs.splice(0)); // destroyed once the commands that use them are submitted
        this.slabAt = UNIFORM_SLAB;
      }
      const u = this.uniformSlot(bytes);
      const entries: GpuBinding[] = ops.map((b, i) => ({
        binding: i,
        resource: { buffer: b.buffer, offset: b.offset, size: b.size },
      }));
      entries.push({ binding: ops.length, resource: { buffer: u.buffer, offset: u.offset, size: bytes.byteLength } });
      group = this.device.createBindGroup({ layout: pipe.getBindGroupLayout(0), entries });
      this.groups.set(key, group);
    }
    this.enc ??= this.device.createCommandEncoder();
    if (this.prof) {
      // one pass per dispatch, timestamped at its start and end
      if (this.pass) this.pass.end();
      const i = this.prof.names.length;
      this.pass = this.enc.beginComputePass({
        timestampWrites: { querySet: this.prof.set, beginningOfPassWriteIndex: 2 * i, endOfPassWriteIndex: 2 * i + 1 },
      });
      this.prof.names.push(name);
    } else this.pass ??= this.enc.beginComputePass();
    this.pass.setPipeline(pipe);
    this.pass.setBindGroup(0, group);
    this.pass.dispatchWorkgroups(gx, gy, gz);
    this.dispatches++;
    if (this.prof) {
      this.pass.end();
      this.pass = null;
      if (this.prof.names.length === PROFILE_SPAN) this.submit();
    }
    if (++this.recorded >= SUBMIT_EVERY) this.submit();
  }

  /** A buffer to destroy once the commands recorded so far (which may use it) are submitted. */
  retire(b: GpuBuffer): void {
    this.temps.push(b);
  }

  /** Forgets every cached bind group (a freed buffer may be named in one). */
  forgetGroups(): void {
    this.groups.clear();
  }

  /** Profile mode: the timestamp readbacks submitted since the last call, for settle() to await. */
  profiled(): Promise<void>[] {
    return this.prof ? this.prof.pending.splice(0) : [];
  }

  /** Profile mode: each shader's dispatches and device time so far (settle() brings the times in). */
  profile(): Map<string, { calls: number; ms: number }> {
    if (!this.prof) throw new Error("webgpu: the engine was made without profile");
    return new Map(this.prof.totals);
  }

  /** Submits what is recorded and destroys the device: the recorder is unusable afterwards. */
  dispose(): void {
    if (this.disposed) return;
    this.submit();
    this.disposed = true;
    this.device.destroy();
  }
}
