/**
 * The webgpu engine (`--backend webgpu`): every kernel of the Kernels interface (kernels.ts), forward and
 * backward, as a WGSL compute shader (webgpu-wgsl.ts) on a WebGPU device, through Dawn's Node binding (the
 * optional npm package `webgpu`, which loads libvulkan.so.1 at run time). Each rank thread calls
 * createWebgpuKernels for itself and opens its own device, but requestAdapter() has no index and Dawn's adapter=
 * flag matches names, which identical GPUs share: every rank of a process gets the same (first) GPU. Several GPUs
 * take one MPI process per GPU, each seeing one (docs/webgpu.md).
 *
 * The arena on the device. The model hands each kernel Float32Array views of its host arrays. The engine mirrors
 * each host ArrayBuffer it is handed (or, on a SharedArrayBuffer, the range it is told about or handed) by one
 * device buffer at the same byte offsets, so a view names a device range: a kernel binds that range. Each mirror
 * is either host-owned (the host array holds the values: a kernel that reads it uploads the view first) or
 * device-owned (a kernel wrote it: the device holds the values, the host array is stale). A kernel that writes a
 * host-owned mirror first uploads all of it, so what it does not write keeps the host's values. settle() reads
 * the arrays it is asked for back into host memory and hands them to the host again. The master weights
 * (weightsAre) are uploaded once after each weightsChanged(), i.e. once per optimizer step.
 *
 * Deferred. A kernel call only records its dispatch (and any upload, as a copy in the same command stream, so
 * the order holds); the whole forward+backward of a micro-batch is queued and submitted in batches, and the
 * rank awaits one settle() per micro-batch: the loss (each cross-entropy row's loss, written on the device and
 * summed here in float64 in row order) and the gradient buffer, read back once. crossEntropy returns 0.
 *
 * Deterministic: the shaders use no atomics and sum in fixed orders, the dispatches are the same for the same
 * calls, so a run on one device model is bit-identical run to run and resumes exactly.
 */
import * as fs from "node:fs";
import * as path from "node:path";
import { spawnSync } from "node:child_process";
import type { Kernels } from "../kernels";
import { packParams, SHADERS, TILE, WG, type ParamsOf, type ShaderName } from "./webgpu-wgsl";

// ------------------------------------------------------------------ the slice of the WebGPU API used here
// (declared here, not taken from @webgpu/types, so the project type-checks without the optional package)

interface GpuBuffer {
  readonly size: number;
  destroy(): void;
  getMappedRange(): ArrayBuffer;
  unmap(): void;
  mapAsync(mode: number): Promise<void>;
}
interface GpuBinding {
  binding: number;
  resource: { buffer: GpuBuffer; offset?: number; size?: number };
}
interface GpuPass {
  setPipeline(p: unknown): void;
  setBindGroup(i: number, g: unknown): void;
  dispatchWorkgroups(x: number, y?: number): void;
  end(): void;
}
interface GpuEncoder {
  beginComputePass(): GpuPass;
  copyBufferToBuffer(src: GpuBuffer, so: number, dst: GpuBuffer, d: number, size: number): void;
  finish(): unknown;
}
interface GpuPipeline {
  getBindGroupLayout(i: number): unknown;
}
export interface GpuDevice {
  readonly limits: Record<string, number>;
  readonly queue: { submit(b: unknown[]): void; onSubmittedWorkDone(): Promise<void> };
  readonly lost: Promise<{ message: string }>;
  onuncapturederror: ((e: { error: { message: string } }) => void) | null;
  createBuffer(d: { size: number; usage: number; mappedAtCreation?: boolean }): GpuBuffer;
  createShaderModule(d: { code: string }): unknown;
  createComputePipeline(d: { layout: "auto"; compute: { module: unknown; entryPoint: string } }): GpuPipeline;
  createBindGroup(d: { layout: unknown; entries: GpuBinding[] }): unknown;
  createCommandEncoder(): GpuEncoder;
  destroy(): void;
}
interface GpuAdapter {
  readonly limits: Record<string, number>;
  readonly info?: { vendor?: string; architecture?: string; device?: string; description?: string };
  requestDevice(d: { requiredLimits: Record<string, number> }): Promise<GpuDevice>;
}
interface Gpu {
  requestAdapter(o?: { powerPreference?: string }): Promise<GpuAdapter | null>;
}

const USAGE = { MAP_READ: 0x1, COPY_SRC: 0x4, COPY_DST: 0x8, UNIFORM: 0x40, STORAGE: 0x80 } as const;
const MAP_READ = 1;
/** Dispatches recorded before the command stream is submitted (bounds the per-dispatch uniform buffers held). */
const SUBMIT_EVERY = 512;
/** WebGPU's guaranteed workgroups per grid dimension. */
const MAX_GROUPS = 65535;

// ------------------------------------------------------------------ loading Dawn

/** Why the engine cannot run here, and the command that fixes it. */
export interface WebgpuUnavailable {
  reason: string;
  fix: string;
}

const INSTALL_PACKAGE = "npm install webgpu@0.6.2";
const DRIVER_VENDOR =
  "install a Vulkan driver: your GPU vendor's (NVIDIA in a container: NVIDIA_DRIVER_CAPABILITIES must include graphics), or the software adapter on Debian 12: ";
const BACKPORTS_INSTALL = "apt-get update && apt-get install -y -t bookworm-backports mesa-vulkan-drivers libvulkan1";

/**
 * The Debian mirror this machine's apt already installs from: the first URI of its sources (deb822 `URIs:` lines
 * under sources.list.d, else `deb URI …` lines of sources.list) that is not the security archive; null when none.
 * The project names no mirror of its own.
 */
export function aptMirror(etcApt = "/etc/apt"): string | null {
  const read = (f: string): string => {
    try {
      return fs.readFileSync(f, "utf8");
    } catch {
      return "";
    }
  };
  let listed: string[] = [];
  try {
    listed = fs.readdirSync(path.join(etcApt, "sources.list.d")).filter((f) => f.endsWith(".sources"));
  } catch {
    // no sources.list.d
  }
  const uris = [
    ...listed
      .sort()
      .flatMap((f) =>
        [...read(path.join(etcApt, "sources.list.d", f)).matchAll(/^URIs:\s*(.+)$/gm)].flatMap((m) =>
          m[1].trim().split(/\s+/),
        ),
      ),
    ...[...read(path.join(etcApt, "sources.list")).matchAll(/^deb\s+(?:\[[^\]]*\]\s+)?(\S+)/gm)].map((m) => m[1]),
  ];
  return uris.find((u) => /^https?:\/\//.test(u) && !/security/.test(u)) ?? null;
}

/** How to get a Vulkan driver here: the software adapter from bookworm-backports on the machine's own mirror. */
export function installDriverAdvice(mirror: string | null = aptMirror()): string {
  if (mirror === null)
    return `${DRIVER_VENDOR}add the bookworm-backports suite (component main) of the Debian mirror you install from to apt's sources (a file under /etc/apt/sources.list.d), then ${BACKPORTS_INSTALL}`;
  return `${DRIVER_VENDOR}printf 'Types: deb\\nURIs: ${mirror}\\nSuites: bookworm-backports\\nComponents: main\\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\\n' > /etc/apt/sources.list.d/backports.sources && ${BACKPORTS_INSTALL}`;
}

/** Dawn's `create` from the package's prebuilt dawn.node (required directly: the package's index is an ES module). */
function loadDawn(): { create: (flags: string[]) => Gpu } | WebgpuUnavailable {
  let dir: string;
  try {
    dir = path.dirname(require.resolve("webgpu/package.json"));
  } catch {
    return { reason: "the npm package webgpu (Dawn's Node binding) is not installed", fix: INSTALL_PACKAGE };
  }
  const file = path.join(
    dir,
    "dist",
    `${process.platform}-${process.platform === "darwin" ? "universal" : process.arch}`,
    "dawn.node",
  );
  if (!fs.existsSync(file))
    return {
      reason: `the webgpu package has no prebuilt binding for ${process.platform}-${process.arch}`,
      fix: INSTALL_PACKAGE,
    };
  try {
    const req: (id: string) => unknown = require;
    return req(file) as { create: (flags: string[]) => Gpu };
  } catch (e) {
    return {
      reason: `dawn.node failed to load: ${e instanceof Error ? e.message.split("\n")[0] : String(e)}`,
      fix: installDriverAdvice(),
    };
  }
}

/** The adapter and its device, or why there is none. */
async function openDevice(): Promise<{ adapter: GpuAdapter; device: GpuDevice; name: string } | WebgpuUnavailable> {
  const dawn = loadDawn();
  if ("reason" in dawn) return dawn;
  const gpu = dawn.create([]);
  // The GPU object must stay reachable, or a later mapAsync crashes the process (SIGSEGV / futex error).
  const g = globalThis as { __tstrainWebgpu?: unknown[] };
  (g.__tstrainWebgpu ??= []).push(gpu);
  const adapter = await gpu.requestAdapter({ powerPreference: "high-performance" });
  if (!adapter)
    return {
      reason:
        "Dawn found no WebGPU adapter (no Vulkan driver with the features it needs: Mesa before 25's lavapipe lacks them)",
      fix: installDriverAdvice(),
    };
  const lim = adapter.limits;
  const device = await adapter.requestDevice({
    requiredLimits: {
      maxStorageBufferBindingSize: lim.maxStorageBufferBindingSize,
      maxBufferSize: lim.maxBufferSize,
      maxStorageBuffersPerShaderStage: Math.min(lim.maxStorageBuffersPerShaderStage, 10),
    },
  });
  const info = adapter.info ?? {};
  const what = [info.vendor, info.architecture, info.device, info.description].filter((s) => s).join(" ");
  return { adapter, device, name: `webgpu (${what || "unnamed adapter"}; Dawn via the webgpu package)` };
}

/**
 * Whether a WebGPU adapter opens here, asked synchronously in a child process (the main thread refuses
 * `--backend webgpu` before any work, P1, and an adapter is only reachable through promises).
 */
export function probeWebgpuSync(): { name: string } | WebgpuUnavailable {
  const dawn = loadDawn();
  if ("reason" in dawn) return dawn;
  const r = spawnSync(process.execPath, ["-e", `require(${JSON.stringify(__filename)}).printWebgpuProbe()`], {
    encoding: "utf8",
    timeout: 60_000,
  });
  const line = (r.stdout ?? "").split("\n").find((l) => l.startsWith("WEBGPU_PROBE "));
  if (!line)
    return {
      reason: `the adapter probe ended without an answer (status ${r.status}${r.signal ? `, ${r.signal}` : ""}): ${(r.stderr ?? "").trim().split("\n").slice(-1)[0] ?? ""}`,
      fix: installDriverAdvice(),
    };
  return JSON.parse(line.slice("WEBGPU_PROBE ".length)) as { name: string } | WebgpuUnavailable;
}

/** The child's side of probeWebgpuSync: one line, `WEBGPU_PROBE {json}`. */
export async function printWebgpuProbe(): Promise<void> {
  const d = await openDevice();
  if ("reason" in d) process.stdout.write(`WEBGPU_PROBE ${JSON.stringify(d)}\n`);
  else {
    process.stdout.write(`WEBGPU_PROBE ${JSON.stringify({ name: d.name })}\n`);
    d.device.destroy();
  }
}

// ------------------------------------------------------------------ mirrors of host arrays

type HostArray = Float32Array | Int32Array;

/** A device mirror of host bytes [start, end) of one (Shared)ArrayBuffer, at the same offsets. */
interface Mirror {
  host: ArrayBufferLike;
  start: number;
  end: number;
  gpu: GpuBuffer;
  /** The device holds the values (a kernel wrote them); the host's are stale. */
  onDevice: boolean;
  /** The master weights: read only, uploaded whole when dirty (weightsAre / weightsChanged). */
  weights: boolean;
  dirty: boolean;
}

/** A bound operand: the device range of a view and the view's first element inside the binding. */
interface Bound {
  buffer: GpuBuffer;
  offset: number;
  size: number;
  elem: number;
}

class WebgpuEngine {
  private readonly mirrors = new WeakMap<ArrayBufferLike, Mirror[]>();
  private readonly pipelines = new Map<ShaderName, GpuPipeline>();
  private readonly align: number;
  private readonly maxBinding: number;
  private enc: GpuEncoder | null = null;
  private pass: GpuPass | null = null;
  private recorded = 0;
  /** Buffers to destroy once the command stream that uses them is submitted. */
  private temps: GpuBuffer[] = [];
  /** Each crossEntropy call's per-row losses since the last settle, with its targeted row count. */
  private losses: { buf: GpuBuffer; rows: number; targeted: number }[] = [];
  private scratch: GpuBuffer | null = null;
  private error: string | null = null;
  private readonly freed = new FinalizationRegistry<GpuBuffer>((b) => this.temps.push(b));
  private disposed = false;
  private readonly weightList: Mirror[] = [];

  constructor(
    private readonly device: GpuDevice,
    readonly name: string,
  ) {
    this.align = device.limits.minStorageBufferOffsetAlignment;
    this.maxBinding = device.limits.maxStorageBufferBindingSize;
    device.onuncapturederror = (e) => {
      this.error ??= e.error.message;
    };
    void device.lost.then((l) => {
      if (!this.disposed) this.error ??= `the WebGPU device was lost: ${l.message}`;
    });
  }

  // ---------------------------------------------------------------- mirrors

  private mirrorOf(a: HostArray, create = true): Mirror | null {
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
    const m: Mirror = { host, start, end, gpu, onDevice: false, weights: false, dirty: true };
    if (!list) this.mirrors.set(host, (list = []));
    list.push(m);
    this.freed.register(host, gpu);
    return m;
  }

  /** Host bytes [lo, hi) into the mirror, as a copy in the command stream (so it lands between the kernels around it). */
  private upload(m: Mirror, lo: number, hi: number): void {
    if (hi <= lo) return;
    const staging = this.device.createBuffer({ size: hi - lo, usage: USAGE.COPY_SRC, mappedAtCreation: true });
    new Uint8Array(staging.getMappedRange()).set(new Uint8Array(m.host, lo, hi - lo));
    staging.unmap();
    this.copyEncoder().copyBufferToBuffer(staging, 0, m.gpu, lo - m.start, hi - lo);
    this.temps.push(staging);
  }

  /** The device range of view a for a kernel that reads ("r"), writes ("w") or does both ("rw"). */
  private bind(a: HostArray, mode: "r" | "w" | "rw"): Bound {
    const m = this.mirrorOf(a) as Mirror;
    const lo = a.byteOffset,
      hi = lo + a.byteLength;
    if (m.weights) {
      if (mode !== "r") throw new Error("webgpu: a kernel was asked to write the master weights");
      if (m.dirty) {
        this.upload(m, m.start, m.end);
        m.dirty = false;
      }
    } else if (!m.onDevice) {
      if (mode !== "r") {
        this.upload(m, m.start, m.end); // what the kernel leaves alone keeps the host's values
        m.onDevice = true;
      } else this.upload(m, lo, hi);
    }
    const dev = lo - m.start,
      offset = Math.floor(dev / this.align) * this.align;
    const size = Math.max(4, dev + a.byteLength - offset);
    this.bindable(size);
    if (offset + size > m.gpu.size) throw new Error("webgpu: an operand's binding runs past its mirror");
    return { buffer: m.gpu, offset, size, elem: (dev - offset) / 4 };
  }

  /** Refuses an operand binding of `size` bytes past the device's maxStorageBufferBindingSize. */
  private bindable(size: number): void {
    if (size > this.maxBinding)
      throw new Error(
        `webgpu: a kernel operand of ${size} bytes exceeds this device's maxStorageBufferBindingSize (${this.maxBinding}); use a smaller --micro-batch or --seq-len`,
      );
  }

  /** The first `floats` of an engine-owned buffer as an operand, held to bind()'s binding-size limit. */
  private own(buffer: GpuBuffer, floats: number): Bound {
    const size = Math.max(4, floats * 4);
    this.bindable(size);
    return { buffer, offset: 0, size, elem: 0 };
  }

  /**
   * Engine scratch of n floats as an operand (attention's scores, dS and P), the buffer grown on demand; refused
   * before it is allocated when its binding would pass the device's limit.
   */
  private scratchOf(n: number): Bound {
    this.bindable(Math.max(4, n * 4));
    if (!this.scratch || this.scratch.size < n * 4) {
      if (this.scratch) this.temps.push(this.scratch);
      this.scratch = this.device.createBuffer({ size: Math.max(16, n * 4), usage: USAGE.STORAGE | USAGE.COPY_SRC });
    }
    return this.own(this.scratch, n);
  }

  // ---------------------------------------------------------------- the command stream

  private copyEncoder(): GpuEncoder {
    if (this.pass) {
      this.pass.end();
      this.pass = null;
    }
    this.enc ??= this.device.createCommandEncoder();
    return this.enc;
  }

  private submit(): void {
    if (this.pass) {
      this.pass.end();
      this.pass = null;
    }
    if (this.enc) this.device.queue.submit([this.enc.finish()]);
    this.enc = null;
    for (const t of this.temps) t.destroy();
    this.temps = [];
    this.recorded = 0;
  }

  private pipeline(name: ShaderName): GpuPipeline {
    let p = this.pipelines.get(name);
    if (!p) {
      const module = this.device.createShaderModule({ code: SHADERS[name].code });
      p = this.device.createComputePipeline({ layout: "auto", compute: { module, entryPoint: "main" } });
      this.pipelines.set(name, p);
    }
    return p;
  }

  /**
   * Records one dispatch of `name` over its operands (bindings 0.., one per storage array of the shader) and its
   * settings by name (the uniform, bound last), on a grid of [x, y] workgroups. A missing or unknown setting,
   * or a wrong operand count, throws (packParams).
   */
  dispatch<N extends ShaderName>(name: N, ops: Bound[], params: ParamsOf<N>, grid: [number, number]): void {
    if (this.disposed) throw new Error("webgpu: the engine was disposed");
    const shader = SHADERS[name];
    if (ops.length !== shader.bindings.length)
      throw new Error(`webgpu: ${name} binds ${shader.bindings.join(", ")}; given ${ops.length} operands`);
    const bytes = packParams(name, shader, params);
    if (grid[0] === 0 || grid[1] === 0) return;
    if (grid[0] > MAX_GROUPS || grid[1] > MAX_GROUPS)
      throw new Error(`webgpu: ${name} needs a grid of ${grid[0]} x ${grid[1]} workgroups, over ${MAX_GROUPS}`);
    const ub = this.device.createBuffer({ size: bytes.byteLength, usage: USAGE.UNIFORM, mappedAtCreation: true });
    new Uint8Array(ub.getMappedRange()).set(new Uint8Array(bytes));
    ub.unmap();
    this.temps.push(ub);
    const pipe = this.pipeline(name);
    const entries: GpuBinding[] = ops.map((b, i) => ({
      binding: i,
      resource: { buffer: b.buffer, offset: b.offset, size: b.size },
    }));
    entries.push({ binding: ops.length, resource: { buffer: ub } });
    const group = this.device.createBindGroup({ layout: pipe.getBindGroupLayout(0), entries });
    if (!this.pass) {
      this.enc ??= this.device.createCommandEncoder();
      this.pass = this.enc.beginComputePass();
    }
    this.pass.setPipeline(pipe);
    this.pass.setBindGroup(0, group);
    this.pass.dispatchWorkgroups(grid[0], grid[1]);
    if (++this.recorded >= SUBMIT_EVERY) this.submit();
  }

  // ---------------------------------------------------------------- the Kernels

  /** A 1-D range of n threads in workgroups of `size`, as a grid. */
  private static grid(n: number, size = WG): [number, number] {
    const groups = Math.ceil(n / size);
    if (groups === 0) return [0, 0];
    const x = Math.min(groups, MAX_GROUPS);
    return [x, Math.ceil(groups / x)];
  }

  kernels(): Kernels {
    const grid = WebgpuEngine.grid;
    const bindR = (a: HostArray) => this.bind(a, "r");
    const d = <N extends ShaderName>(name: N, ops: Bound[], params: ParamsOf<N>, g: [number, number]) =>
      this.dispatch(name, ops, params, g);
    const e = (b: Bound) => b.elem;
    const k: Kernels = {
      name: this.name,
      matmul: (tA, tB, M, N, K, alpha, A, B, beta, C) => {
        if (A.length < M * K || B.length < K * N || C.length < M * N)
          throw new RangeError(`matmul: A ${A.length}, B ${B.length}, C ${C.length} floats for M=${M} N=${N} K=${K}`);
        if (M === 0 || N === 0) return;
        const a = bindR(A),
          b = bindR(B),
          c = this.bind(C, beta === 0 ? "w" : "rw");
        const f = { M, N, K, tA: tA ? 1 : 0, tB: tB ? 1 : 0, oA: e(a), oB: e(b), oC: e(c), alpha, beta };
        d("matmul", [a, b, c], f, [Math.ceil(N / TILE), Math.ceil(M / TILE)]);
      },
      embeddingForward: (out, ids, E, N, D) => {
        const i = bindR(ids),
          t = bindR(E),
          o = this.bind(out, "w");
        d("embeddingForward", [o, i, t], { n: N * D, D, oO: e(o), oI: e(i), oE: e(t) }, grid(N * D));
      },
      embeddingBackward: (dE, ids, dout, N, D) => {
        const i = bindR(ids),
          g = bindR(dout),
          o = this.bind(dE, "rw");
        d("embeddingBackward", [o, i, g], { N, D, oE: e(o), oI: e(i), oD: e(g) }, grid(D));
      },
      rmsnormForward: (out, rstd, x, w, N, D, eps) => {
        const xb = bindR(x),
          wb = bindR(w),
          o = this.bind(out, "w"),
          r = this.bind(rstd, "w");
        const f = { N, D, oO: e(o), oR: e(r), oX: e(xb), oW: e(wb), eps };
        d("rmsnormForward", [o, r, xb, wb], f, grid(N, 1));
      },
      rmsnormBackward: (dx, dw, dout, x, w, rstd, N, D) => {
        const g = bindR(dout),
          xb = bindR(x),
          wb = bindR(w),
          r = bindR(rstd),
          o = this.bind(dx, "rw"),
          ow = this.bind(dw, "rw");
        const f = { N, D, oDX: e(o), oDO: e(g), oX: e(xb), oW: e(wb), oR: e(r) };
        d("rmsnormBackward", [o, g, xb, wb, r], f, grid(N, 1));
        d("rmsnormBackwardW", [ow, g, xb, r], { N, D, oDW: e(ow), oDO: e(g), oX: e(xb), oR: e(r) }, grid(D));
      },
      ropeForward: (x, cos, sin, B, T, nh, E) => this.rope(x, cos, sin, B, T, nh, E, 1),
      ropeBackward: (x, cos, sin, B, T, nh, E) => this.rope(x, cos, sin, B, T, nh, E, -1),
      attentionForward: (out, lse, q, k, v, B, T, H, K, E) => {
        const qb = bindR(q),
          kb = bindR(k),
          vb = bindR(v),
          s = this.scratchOf(B * H * T * T),
          o = this.bind(out, "w"),
          l = this.bind(lse, "w");
        d(
          "attentionForward",
          [o, l, s, qb, kb, vb],
          { B, T, H, K, E, oO: e(o), oL: e(l), oQ: e(qb), oK: e(kb), oV: e(vb), scale: 1 / Math.sqrt(E) },
          grid(B * H * T, 64),
        );
      },
      attentionBackward: (dq, dk, dv, dout, q, k, v, out, lse, B, T, H, K, E) => {
        const n = B * H * T * T; // dS, then the recomputed probabilities P
        const g = bindR(dout),
          qb = bindR(q),
          kb = bindR(k),
          vb = bindR(v),
          ob = bindR(out),
          l = bindR(lse),
          s = this.scratchOf(2 * n),
          oq = this.bind(dq, "w"),
          ok = this.bind(dk, "w"),
          ov = this.bind(dv, "w");
        d(
          "attentionBackwardQ",
          [oq, s, g, qb, kb, vb, ob, l],
          {
            B,
            T,
            H,
            K,
            E,
            oDQ: e(oq),
            oDO: e(g),
            oQ: e(qb),
            oK: e(kb),
            oV: e(vb),
            oO: e(ob),
            oL: e(l),
            pOff: n,
            scale: 1 / Math.sqrt(E),
          },
          grid(B * H * T, 64),
        );
        d(
          "attentionBackwardKV",
          [ok, ov, s, qb, g],
          { B, T, H, K, E, oDK: e(ok), oDV: e(ov), oQ: e(qb), oDO: e(g), pOff: n },
          grid(B * T * K * E),
        );
      },
      attentionCachedForward: (out, q, kCache, vCache, P, T, H, K, E) => {
        const qb = bindR(q),
          kb = bindR(kCache),
          vb = bindR(vCache),
          s = this.scratchOf(T * H * (P + T)),
          o = this.bind(out, "w");
        d(
          "attentionCachedForward",
          [o, s, qb, kb, vb],
          { P, T, H, K, E, oO: e(o), oQ: e(qb), oK: e(kb), oV: e(vb), scale: 1 / Math.sqrt(E) },
          grid(T * H, 64),
        );
      },
      swigluForward: (out, gate, up, n) => {
        const g = bindR(gate),
          u = bindR(up),
          o = this.bind(out, "w");
        d("swigluForward", [o, g, u], { n, oO: e(o), oG: e(g), oU: e(u) }, grid(n));
      },
      swigluBackward: (dgate, dup, dout, gate, up, n) => {
        const g = bindR(gate),
          u = bindR(up),
          go = bindR(dout),
          og = this.bind(dgate, "w"),
          ou = this.bind(dup, "w");
        const f = { n, oDG: e(og), oDU: e(ou), oDO: e(go), oG: e(g), oU: e(u) };
        d("swigluBackward", [og, ou, go, g, u], f, grid(n));
      },
      crossEntropy: (logits, targets, rows, V, gradScale) => {
        if (rows === 0) return 0;
        let targeted = 0;
        for (let r = 0; r < rows; r++) if (targets[r] >= 0) targeted++;
        const t = bindR(targets),
          x = this.bind(logits, gradScale > 0 ? "rw" : "r");
        const buf = this.device.createBuffer({ size: Math.max(16, rows * 4), usage: USAGE.STORAGE | USAGE.COPY_SRC });
        this.losses.push({ buf, rows, targeted });
        const f = { rows, V, oX: e(x), oT: e(t), gs: gradScale };
        d("crossEntropy", [x, t, this.own(buf, rows)], f, grid(rows, 1));
        return 0; // deferred: settle() returns the loss
      },
      copy: (dst, src) => {
        if (dst.length !== src.length) throw new RangeError(`copy: ${dst.length} floats from ${src.length}`);
        const s = bindR(src),
          o = this.bind(dst, "w");
        d("copy", [o, s], { n: src.length, oD: e(o), oS: e(s) }, grid(src.length));
      },
      fill: (x, value) => {
        const o = this.bind(x, "w");
        d("fill", [o], { n: x.length, oD: e(o), value }, grid(x.length));
      },
      weightsAre: (params) => this.weightsAre(params),
      weightsChanged: () => this.weightsChanged(),
      settle: (readback) => this.settle(readback),
      dispose: () => this.dispose(),
    };
    return k;
  }

  private rope(
    x: Float32Array,
    cos: Float32Array,
    sin: Float32Array,
    B: number,
    T: number,
    nh: number,
    E: number,
    sign: 1 | -1,
  ): void {
    const h = E / 2,
      c = this.bind(cos, "r"),
      s = this.bind(sin, "r"),
      o = this.bind(x, "rw");
    this.dispatch(
      "rope",
      [o, c, s],
      { n: B * T * nh * h, T, nh, h, oX: o.elem, oC: c.elem, oS: s.elem, sign },
      WebgpuEngine.grid(B * T * nh * h),
    );
  }

  private weightsAre(params: Float32Array): void {
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
      m = { host: params.buffer, start: lo, end: hi, gpu, onDevice: false, weights: true, dirty: true };
      list.push(m);
      this.mirrors.set(params.buffer, list);
      this.freed.register(params.buffer, gpu);
    }
    if (m.onDevice) throw new Error("webgpu: weightsAre on an array a kernel wrote");
    m.weights = true;
    m.dirty = true;
    if (!this.weightList.includes(m)) this.weightList.push(m);
  }

  /** Every weights mirror re-uploads before its next read (a WeakMap cannot be walked: they are listed). */
  private weightsChanged(): void {
    for (const m of this.weightList) m.dirty = true;
  }

  /** Waits for everything queued; reads `readback` into host memory; the mean loss of the crossEntropy rows since the last settle. */
  private async settle(readback: Float32Array[]): Promise<{ loss: number; rows: number }> {
    const jobs: { m: Mirror; staging: GpuBuffer }[] = [];
    for (const a of readback) {
      const m = this.mirrorOf(a, false);
      if (!m?.onDevice || jobs.some((j) => j.m === m)) continue;
      const staging = this.device.createBuffer({
        size: Math.max(4, m.end - m.start),
        usage: USAGE.MAP_READ | USAGE.COPY_DST,
      });
      this.copyEncoder().copyBufferToBuffer(m.gpu, 0, staging, 0, m.end - m.start);
      jobs.push({ m, staging });
    }
    const losses = this.losses;
    this.losses = [];
    const lossRows = losses.reduce((s, l) => s + l.rows, 0);
    let lossStaging: GpuBuffer | null = null;
    if (lossRows > 0) {
      lossStaging = this.device.createBuffer({ size: lossRows * 4, usage: USAGE.MAP_READ | USAGE.COPY_DST });
      let at = 0;
      for (const l of losses) {
        this.copyEncoder().copyBufferToBuffer(l.buf, 0, lossStaging, at, l.rows * 4);
        at += l.rows * 4;
        this.temps.push(l.buf);
      }
    }
    this.submit();
    await Promise.all([...jobs.map((j) => j.staging.mapAsync(MAP_READ)), lossStaging?.mapAsync(MAP_READ)]);
    if (this.error) throw new Error(`webgpu: ${this.error}`);
    for (const { m, staging } of jobs) {
      new Uint8Array(m.host, m.start, m.end - m.start).set(new Uint8Array(staging.getMappedRange()));
      staging.unmap();
      staging.destroy();
      m.onDevice = false;
    }
    let sum = 0,
      rows = 0;
    if (lossStaging) {
      const v = new Float32Array(lossStaging.getMappedRange());
      for (let i = 0; i < lossRows; i++) sum += v[i];
      lossStaging.unmap();
      lossStaging.destroy();
      rows = losses.reduce((s, l) => s + l.targeted, 0);
    }
    return { loss: rows > 0 ? sum / rows : 0, rows };
  }

  private dispose(): void {
    if (this.disposed) return;
    this.submit();
    this.disposed = true;
    this.device.destroy();
  }
}

/**
 * This thread's webgpu engine: its own adapter and device, or why there is none (the caller refuses with the fix,
 * P1). Each rank thread calls it for itself.
 */
export async function createWebgpuKernels(): Promise<{ kernels: Kernels } | WebgpuUnavailable> {
  const d = await openDevice();
  if ("reason" in d) return d;
  return { kernels: new WebgpuEngine(d.device, d.name).kernels() };
}

/** The webgpu engine on a given device, its kernels and its dispatch (a test's recording device: model.webgpu-params.test.ts). */
export function webgpuEngineOn(
  device: GpuDevice,
  name: string,
): { kernels: Kernels; dispatch: WebgpuEngine["dispatch"] } {
  const engine = new WebgpuEngine(device, name);
  return { kernels: engine.kernels(), dispatch: engine.dispatch.bind(engine) };
}
