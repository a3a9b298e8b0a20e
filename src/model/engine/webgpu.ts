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
 * rmsnormBackward defers its dw further: each call writes per-block partial column sums, and one rmsnormBackwardW
 * dispatch adds every pending call's sums into its dw, recorded before the next dispatch that binds a pending dw, a
 * second call on one dw, or settle (a micro-batch's 2L+1 norms: one dispatch where one binding spans their dws).
 * embeddingBackward takes per-token occurrence lists built here from the host's token ids (uploaded as an input).
 *
 * Deterministic: the shaders use no atomics and sum in fixed orders, the dispatches are the same for the same
 * calls, so a run on one device model is bit-identical run to run and resumes exactly.
 *
 * Attention is fused (webgpu-wgsl.ts: FlashAttention-2's scheme): the forward and the cached forward one dispatch
 * each, the backward one dispatch for dq, dk and dv; the engine allocates nothing for it but the operands' mirrors
 * (no scores, no scratch), and refuses a head size over the shaders' ATT_EMAX.
 */
import * as fs from "node:fs";
import * as path from "node:path";
import { spawnSync } from "node:child_process";
import type { DeviceTraffic, Kernels, MatmulJob, SettleOptions } from "../kernels";
import {
  ATT_BQ,
  ATT_EMAX,
  BK,
  MAX_JOBS,
  MAX_TERMS,
  MM_BUFFERS,
  mmField,
  packParams,
  rmsnormRows,
  SHADERS,
  TILE,
  WG,
  type ParamsOf,
  type ShaderName,
} from "./webgpu-wgsl";

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
  dispatchWorkgroups(x: number, y?: number, z?: number): void;
  end(): void;
}
interface GpuTimestampWrites {
  querySet: unknown;
  beginningOfPassWriteIndex: number;
  endOfPassWriteIndex: number;
}
interface GpuEncoder {
  beginComputePass(d?: { timestampWrites?: GpuTimestampWrites }): GpuPass;
  copyBufferToBuffer(src: GpuBuffer, so: number, dst: GpuBuffer, d: number, size: number): void;
  clearBuffer(b: GpuBuffer, offset?: number, size?: number): void;
  resolveQuerySet(q: unknown, first: number, count: number, dst: GpuBuffer, offset: number): void;
  finish(): unknown;
}
interface GpuPipeline {
  getBindGroupLayout(i: number): unknown;
}
export interface GpuDevice {
  readonly limits: Record<string, number>;
  readonly features?: { has(f: string): boolean };
  readonly queue: {
    submit(b: unknown[]): void;
    onSubmittedWorkDone(): Promise<void>;
    writeBuffer(b: GpuBuffer, offset: number, data: ArrayBufferView): void;
  };
  readonly lost: Promise<{ message: string }>;
  onuncapturederror: ((e: { error: { message: string } }) => void) | null;
  createBuffer(d: { size: number; usage: number; mappedAtCreation?: boolean }): GpuBuffer;
  createShaderModule(d: { code: string }): unknown;
  createComputePipeline(d: { layout: "auto"; compute: { module: unknown; entryPoint: string } }): GpuPipeline;
  createBindGroup(d: { layout: unknown; entries: GpuBinding[] }): unknown;
  createQuerySet?(d: { type: "timestamp"; count: number }): unknown;
  createCommandEncoder(): GpuEncoder;
  destroy(): void;
}
interface GpuAdapter {
  readonly limits: Record<string, number>;
  readonly features: { has(f: string): boolean };
  readonly info?: { vendor?: string; architecture?: string; device?: string; description?: string };
  requestDevice(d: { requiredLimits: Record<string, number>; requiredFeatures?: string[] }): Promise<GpuDevice>;
}
interface Gpu {
  requestAdapter(o?: { powerPreference?: string }): Promise<GpuAdapter | null>;
}

const USAGE = {
  MAP_READ: 0x1,
  COPY_SRC: 0x4,
  COPY_DST: 0x8,
  UNIFORM: 0x40,
  STORAGE: 0x80,
  QUERY_RESOLVE: 0x200,
} as const;
const MAP_READ = 1;
/** Dispatches recorded before the command stream is submitted (the device starts on them while the host records more). */
const SUBMIT_EVERY = 512;
/** The features the engine asks for where the adapter has them: timing (the bench's profile), and two it reports. */
const WANTED_FEATURES = ["timestamp-query", "subgroups", "shader-f16"] as const;
/** Bytes of one uniform slab (the dispatches' settings, each at an aligned offset, written once and kept). */
const UNIFORM_SLAB = 1 << 16;
/** Cached bind groups before the cache starts again (a run repeats its dispatches; generation's grow with the cache). */
const MAX_GROUPS_CACHED = 1 << 14;
/** Bytes copied at a time from a SharedArrayBuffer (which writeBuffer does not take) through a bounce buffer. */
const BOUNCE = 1 << 24;
/** Timestamped dispatches resolved at a time, in profile mode. */
const PROFILE_SPAN = 2048;
/** A product is split along K (matmuls) when its output has fewer tiles than this and K is at least SPLIT_MIN_K... */
const SPLIT_TILES = 32;
const SPLIT_MIN_K = 1024;
/** ...into enough splits for about this many workgroups, at most SPLIT_MAX, each at least SPLIT_MIN_K / 4 long. */
const SPLIT_GROUPS = 256;
const SPLIT_MAX = 16;
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
  const features = WANTED_FEATURES.filter((f) => adapter.features.has(f));
  const device = await adapter.requestDevice({
    requiredFeatures: [...features],
    requiredLimits: {
      maxStorageBufferBindingSize: lim.maxStorageBufferBindingSize,
      maxBufferSize: lim.maxBufferSize,
      maxStorageBuffersPerShaderStage: Math.min(lim.maxStorageBuffersPerShaderStage, 10),
      maxComputeWorkgroupStorageSize: lim.maxComputeWorkgroupStorageSize,
      maxComputeInvocationsPerWorkgroup: lim.maxComputeInvocationsPerWorkgroup,
      maxComputeWorkgroupSizeX: lim.maxComputeWorkgroupSizeX,
      maxComputeWorkgroupSizeY: lim.maxComputeWorkgroupSizeY,
    },
  });
  return { adapter, device, name: adapterFacts(adapter, features) };
}

/**
 * The adapter in words for the start line: vendor, architecture, device and driver, the features the engine asked
 * for that it has (of timestamp-query, subgroups, shader-f16), and the limits that shape its kernels.
 */
export function adapterFacts(adapter: GpuAdapter, features: readonly string[]): string {
  const info = adapter.info ?? {};
  const what = [info.vendor, info.architecture, info.device, info.description].filter((s) => s).join(" ");
  const lim = adapter.limits;
  const mib = (b: number) => `${Math.floor(b / 2 ** 20)} MiB`;
  const missing = WANTED_FEATURES.filter((f) => !features.includes(f));
  return (
    `webgpu (${what || "unnamed adapter"}; Dawn via the webgpu package; ` +
    `features: ${features.join(", ") || "none"}${missing.length ? ` (not ${missing.join(", ")})` : ""}; ` +
    `workgroup storage ${lim.maxComputeWorkgroupStorageSize} B, ${lim.maxComputeInvocationsPerWorkgroup} invocations, ` +
    `storage binding ${mib(lim.maxStorageBufferBindingSize)}, buffer ${mib(lim.maxBufferSize)})`
  );
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

/** Refuses a head size past what the fused attention's tiles in workgroup memory hold (webgpu-wgsl.ts ATT_EMAX). */
function attentionFits(E: number): void {
  if (E > ATT_EMAX)
    throw new Error(
      `webgpu: attention takes a head size of at most ${ATT_EMAX} (its tiles in workgroup memory are sized for it); this model's is ${E}; use --backend native`,
    );
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
  /** A constant (constant()): uploaded whole once, then resident. */
  constant: boolean;
  dirty: boolean;
  /** A host-owned input: the byte range uploaded since the last settle() call, which needs no second upload. */
  fresh: { epoch: number; lo: number; hi: number } | null;
}

/** What one upload carried (DeviceTraffic's up). */
type UpKind = keyof DeviceTraffic["up"];

/** A bound operand: the device range of a view and the view's first element inside the binding. */
interface Bound {
  buffer: GpuBuffer;
  offset: number;
  size: number;
  elem: number;
}

/** When the engine splits a product along K (matmuls): "auto" by its shape; "on" and "off" are tests'. */
export type SplitK = "auto" | "on" | "off";

/** The engine's options: profile mode (every dispatch timed), and two for tests. */
export interface EngineOptions {
  profile?: boolean;
  splitK?: SplitK;
  /** A shader's WGSL replaced (its bindings and settings kept): a test's planted defect. */
  shaders?: Partial<Record<ShaderName, string>>;
}

/** Every setting of shader `name`: `v`'s, the rest 0 (a matmuls dispatch's unused job and term slots). */
function withZeros(name: ShaderName, v: Record<string, number>): Record<string, number> {
  const params = SHADERS[name].params;
  for (const n of Object.keys(v)) if (!Object.hasOwn(params, n)) throw new Error(`webgpu: ${name} has no setting ${n}`);
  return Object.fromEntries(Object.keys(params).map((n) => [n, v[n] ?? 0]));
}

class WebgpuEngine {
  private readonly mirrors = new WeakMap<ArrayBufferLike, Mirror[]>();
  private readonly pipelines = new Map<ShaderName, GpuPipeline>();
  /** A test's replacement WGSL for some shaders (webgpuEngineOn's `shaders`); empty in every run. */
  private readonly code: Partial<Record<ShaderName, string>>;
  private readonly align: number;
  private readonly maxBinding: number;
  private enc: GpuEncoder | null = null;
  private pass: GpuPass | null = null;
  private recorded = 0;
  /** Buffers to destroy once the command stream that uses them is submitted. */
  private temps: GpuBuffer[] = [];
  /** Each crossEntropy call's per-row losses since the last settle: its rows of lossBuf, and its targeted row count. */
  private losses: { buf: GpuBuffer; at: number; rows: number; targeted: number }[] = [];
  /** The crossEntropy rows' losses since the last settle (grown on demand; a replaced one lives until that settle). */
  private lossBuf: GpuBuffer | null = null;
  private lossAt = 0;
  private lossRetired: GpuBuffer[] = [];
  /**
   * rmsnormBackward's deferred weight gradients: each call wrote its partial column sums into `part` (from
   * partAt on) and left dw += their sum to one rmsnormBackwardW dispatch for all of them (flushNorms), recorded
   * before the next kernel that binds a pending dw, or at settle.
   */
  private pendingNorms: { dw: Bound; pOff: number; nb: number; D: number }[] = [];
  private part: GpuBuffer | null = null;
  private partAt = 0;
  /** rmsnormBackwardW's set tables, each written once into `tables` and found again by its words. */
  private tables: GpuBuffer | null = null;
  private tablesAt = 0;
  private readonly tableAt = new Map<string, number>();
  /** embeddingBackward's occurrence lists (CSR), a host array bound as an input: a fresh range per call within a settle. */
  private csr = new Int32Array(0);
  private csrAt = 0;
  private csrEpoch = -1;
  /** The split products' partial sums (matmuls), engine-owned. */
  private parts: GpuBuffer | null = null;
  /** The bindings a matmuls dispatch leaves unused, each a slice of this. */
  private spare: GpuBuffer | null = null;
  /** When a product is split along K: by its shape ("auto"), always (K > 64: a test's), or never. */
  private readonly splitK: SplitK;
  private error: string | null = null;
  private readonly freed = new FinalizationRegistry<GpuBuffer>((b) => {
    this.temps.push(b);
    this.groups.clear(); // a cached bind group may name the freed buffer
  });
  private disposed = false;
  private readonly weightList: Mirror[] = [];
  /** settle() calls so far: an input uploaded in this epoch is still the host's (kernels.ts: settle). */
  private epoch = 0;
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
  private bounceBuf: Uint8Array | null = null;
  private readonly counts: DeviceTraffic = {
    up: { weights: 0, constants: 0, inputs: 0, state: 0 },
    down: { arrays: 0, loss: 0 },
    dispatches: 0,
  };
  /** Profile mode: every dispatch in its own timestamped pass, its time added to its shader's total. */
  private readonly prof: {
    set: unknown;
    resolve: GpuBuffer;
    names: string[];
    pending: Promise<void>[];
    totals: Map<string, { calls: number; ms: number }>;
  } | null = null;

  constructor(
    private readonly device: GpuDevice,
    readonly name: string,
    opts: EngineOptions = {},
  ) {
    this.splitK = opts.splitK ?? "auto";
    this.code = opts.shaders ?? {};
    this.align = device.limits.minStorageBufferOffsetAlignment;
    this.uniformAlign = device.limits.minUniformBufferOffsetAlignment;
    this.maxBinding = device.limits.maxStorageBufferBindingSize;
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
    this.submit();
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
  private bind(a: HostArray, mode: "r" | "w" | "rw"): Bound {
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
  private stagingOf(size: number): GpuBuffer {
    const free = this.stagingPool.get(size);
    return free?.pop() ?? this.device.createBuffer({ size, usage: USAGE.MAP_READ | USAGE.COPY_DST });
  }

  private release(b: GpuBuffer): void {
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

  private pipeline(name: ShaderName): GpuPipeline {
    let p = this.pipelines.get(name);
    if (!p) {
      const module = this.device.createShaderModule({ code: this.code[name] ?? SHADERS[name].code });
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
  dispatch<N extends ShaderName>(
    name: N,
    ops: Bound[],
    params: ParamsOf<N>,
    grid: [number, number] | [number, number, number],
  ): void {
    if (this.disposed) throw new Error("webgpu: the engine was disposed");
    const shader = SHADERS[name];
    if (ops.length !== shader.bindings.length)
      throw new Error(`webgpu: ${name} binds ${shader.bindings.join(", ")}; given ${ops.length} operands`);
    const bytes = packParams(name, shader, params);
    if (name !== "rmsnormBackwardW") this.flushFor(ops); // a kernel that binds a pending dw sees it complete
    const [gx, gy, gz = 1] = grid;
    if (gx === 0 || gy === 0 || gz === 0) return;
    if (gx > MAX_GROUPS || gy > MAX_GROUPS || gz > MAX_GROUPS)
      throw new Error(`webgpu: ${name} needs a grid of ${gx} x ${gy} x ${gz} workgroups, over ${MAX_GROUPS}`);
    const pipe = this.pipeline(name);
    // the same pipeline, operand ranges and settings as an earlier dispatch: its bind group (and uniform) again
    const key = `${name}|${ops.map((b) => `${this.bufferId(b.buffer)}:${b.offset}:${b.size}`).join(",")}|${new Uint32Array(bytes).join(",")}`;
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
    this.counts.dispatches++;
    if (this.prof) {
      this.pass.end();
      this.pass = null;
      if (this.prof.names.length === PROFILE_SPAN) this.submit();
    }
    if (++this.recorded >= SUBMIT_EVERY) this.submit();
  }

  // ---------------------------------------------------------------- the matrix products

  /** K splits of one product (matmuls): 1, unless its output has few tiles and its K is long (or the option says). */
  private splitsOf(M: number, N: number, K: number): { S: number; kc: number } {
    const tiles = Math.ceil(M / TILE) * Math.ceil(N / TILE);
    let S = 1;
    if (this.splitK === "on") S = Math.min(SPLIT_MAX, Math.ceil(K / (4 * BK)));
    else if (this.splitK === "auto" && tiles < SPLIT_TILES && K >= SPLIT_MIN_K)
      S = Math.min(SPLIT_MAX, Math.ceil(SPLIT_GROUPS / tiles), Math.floor(K / (SPLIT_MIN_K / 4)));
    if (S <= 1) return { S: 1, kc: Math.max(K, 1) };
    const kc = Math.ceil(Math.ceil(K / S) / BK) * BK;
    return { S: Math.ceil(K / kc), kc };
  }

  /** The first `floats` of an engine-owned buffer as an operand, held to bind()'s binding-size limit. */
  private own(buffer: GpuBuffer, floats: number): Bound {
    const size = Math.max(4, floats * 4);
    this.bindable(size);
    return { buffer, offset: 0, size, elem: 0 };
  }

  /** The partial sums' buffer of a split product (engine-owned, grown on demand), n floats of it as an operand. */
  private partsOf(n: number): Bound {
    this.bindable(Math.max(4, n * 4));
    if (!this.parts || this.parts.size < n * 4) {
      if (this.parts) this.temps.push(this.parts);
      this.parts = this.device.createBuffer({ size: Math.max(16, n * 4), usage: USAGE.STORAGE | USAGE.COPY_SRC });
    }
    return this.own(this.parts, Math.max(1, n));
  }

  /** Kernels.matmuls: each group of jobs that fits one dispatch's settings and bindings as one (two when split). */
  private matmuls(jobs: readonly MatmulJob[]): void {
    const live: MatmulJob[] = [];
    for (const job of jobs) {
      if (job.terms.length === 0) throw new RangeError("matmuls: a job without terms");
      const { M, N } = job.terms[0];
      for (const t of job.terms) {
        if (t.M !== M || t.N !== N) throw new RangeError(`matmuls: a job's terms are ${M}x${N} and ${t.M}x${t.N}`);
        if (t.A.length < M * t.K || t.B.length < t.K * N)
          throw new RangeError(`matmul: A ${t.A.length}, B ${t.B.length} floats for M=${M} N=${N} K=${t.K}`);
      }
      if (job.C.length < M * N || (job.add && job.add.length < M * N))
        throw new RangeError(
          `matmul: C ${job.C.length}${job.add ? `, add ${job.add.length}` : ""} floats for M=${M} N=${N}`,
        );
      if (M > 0 && N > 0) live.push(job);
    }
    const run = (group: MatmulJob[]): void => {
      if (group.length === 0) return;
      if (group.length > MAX_JOBS || (!this.matmulGroup(group) && group.length > 1)) {
        const half = Math.ceil(group.length / 2);
        run(group.slice(0, half));
        run(group.slice(half));
      }
    };
    const terms = (j: MatmulJob) => Math.ceil(j.terms.length / MAX_TERMS);
    for (const job of live)
      if (terms(job) > 1) {
        // a job of more terms than one dispatch holds: its first MAX_TERMS, then the rest added (beta 1)
        for (let i = 0; i < job.terms.length; i += MAX_TERMS)
          run([
            i === 0
              ? { ...job, terms: job.terms.slice(0, MAX_TERMS) }
              : { C: job.C, beta: 1, terms: job.terms.slice(i, i + MAX_TERMS) },
          ]);
      }
    run(live.filter((j) => terms(j) === 1));
  }

  /**
   * One matmuls dispatch (and its reduce, when a job is split) for up to MAX_JOBS jobs of up to MAX_TERMS terms:
   * false, recording nothing, when their operands need more than MM_BUFFERS bindings.
   */
  private matmulGroup(group: MatmulJob[]): boolean {
    // the operands' device ranges, each distinct buffer bound once over the range its views span (b0..b7)
    const views: { a: Float32Array; mode: "r" | "w" | "rw" }[] = [];
    for (const job of group) {
      for (const t of job.terms) views.push({ a: t.A, mode: "r" }, { a: t.B, mode: "r" });
      if (job.add) views.push({ a: job.add, mode: "r" });
    }
    const outs = group.map((job) => ({ a: job.C, mode: (job.beta === 0 || job.add ? "w" : "rw") as "w" | "rw" }));
    const all = [...views, ...outs]; // bound as matmul bound them: its inputs, then its output
    const table: { buffer: GpuBuffer; lo: number; hi: number }[] = [];
    const place = (b: Bound): void => {
      const same = table.filter((x) => x.buffer === b.buffer);
      for (const x of same) {
        const lo = Math.min(x.lo, b.offset),
          hi = Math.max(x.hi, b.offset + b.size);
        if (hi - lo <= this.maxBinding) {
          x.lo = lo;
          x.hi = hi;
          return;
        }
      }
      table.push({ buffer: b.buffer, lo: b.offset, hi: b.offset + b.size });
    };
    // what bind() would give, without binding (an upload) before the group is known to fit
    const probe = (a: Float32Array): Bound | null => {
      const m = this.mirrorOf(a, false);
      if (!m) return null;
      const dev = a.byteOffset - m.start,
        offset = Math.floor(dev / this.align) * this.align;
      return { buffer: m.gpu, offset, size: Math.max(4, dev + a.byteLength - offset), elem: 0 };
    };
    // a view not mirrored yet: one binding per host buffer (a plain ArrayBuffer is mirrored whole), or per view
    const unknown = new Set<unknown>();
    for (const { a } of all) {
      const b = probe(a);
      if (b) place(b);
      else unknown.add(a.buffer instanceof SharedArrayBuffer ? a : a.buffer);
    }
    if (table.length + unknown.size > MM_BUFFERS) return false;
    table.length = 0;
    const bound = new Map<Float32Array, Bound>();
    for (const v of all) {
      const b = bound.get(v.a) ?? this.bind(v.a, v.mode);
      bound.set(v.a, b);
      place(b);
    }
    if (table.length > MM_BUFFERS) throw new Error("webgpu: matmuls needs more bindings than it probed");
    const at = (a: Float32Array): { b: number; o: number } => {
      const x = bound.get(a)!;
      const i = table.findIndex((t) => t.buffer === x.buffer && t.lo <= x.offset && x.offset + x.size <= t.hi);
      return { b: i, o: (x.offset - table[i].lo) / 4 + x.elem };
    };
    // each job's workgroups, splits and partial sums
    const v: Record<string, number> = { jobs: group.length };
    const r: Record<string, number> = { jobs: 0 };
    const split: number[] = [];
    let groups = 0,
      partial = 0,
      elems = 0;
    const single = group.length === 1 && group[0].terms.length === 1;
    group.forEach((job, j) => {
      const { M, N } = job.terms[0];
      const X = Math.ceil(N / TILE),
        T = Math.ceil(M / TILE) * X;
      const s = job.terms.map((t) => this.splitsOf(M, N, t.K));
      const sp = Math.max(...s.map((x) => x.S));
      const c = at(job.C),
        d = job.add ? at(job.add) : c;
      Object.assign(v, {
        [mmField("F", j)]: groups,
        [mmField("T", j)]: T,
        [mmField("X", j)]: X,
        [mmField("sp", j)]: sp,
        [mmField("M", j)]: M,
        [mmField("N", j)]: N,
        [mmField("nt", j)]: job.terms.length,
        [mmField("bC", j)]: c.b,
        [mmField("oC", j)]: c.o,
        [mmField("ad", j)]: job.add ? 1 : 0,
        [mmField("bD", j)]: d.b,
        [mmField("oD", j)]: d.o,
      });
      groups += T * sp;
      const rj = split.length;
      if (sp > 1) {
        split.push(j);
        Object.assign(r, {
          [mmField("F", rj)]: elems,
          [mmField("E", rj)]: elems + M * N,
          [mmField("MN", rj)]: M * N,
          [mmField("nt", rj)]: job.terms.length,
          [mmField("bC", rj)]: c.b,
          [mmField("oC", rj)]: c.o,
          [mmField("ad", rj)]: job.add ? 1 : 0,
          [mmField("bD", rj)]: d.b,
          [mmField("oD", rj)]: d.o,
        });
        elems += M * N;
      }
      job.terms.forEach((t, i) => {
        const a = at(t.A),
          b = at(t.B);
        const be = i > 0 || job.add ? 1 : job.beta;
        const pO = sp > 1 ? partial : 0;
        if (sp > 1) partial += s[i].S * M * N;
        if (!single) Object.assign(v, { [mmField("tA", j, i)]: t.tA ? 1 : 0, [mmField("tB", j, i)]: t.tB ? 1 : 0 });
        Object.assign(v, {
          [mmField("K", j, i)]: t.K,
          [mmField("S", j, i)]: s[i].S,
          [mmField("kc", j, i)]: s[i].kc,
          [mmField("al", j, i)]: t.alpha,
          [mmField("be", j, i)]: be,
          [mmField("bA", j, i)]: a.b,
          [mmField("oA", j, i)]: a.o,
          [mmField("bB", j, i)]: b.b,
          [mmField("oB", j, i)]: b.o,
          [mmField("pO", j, i)]: pO,
        });
        if (sp > 1)
          Object.assign(r, {
            [mmField("S", rj, i)]: s[i].S,
            [mmField("al", rj, i)]: t.alpha,
            [mmField("be", rj, i)]: be,
            [mmField("pO", rj, i)]: pO,
          });
      });
    });
    r.jobs = split.length;
    const name: ShaderName = single
      ? (`matmul_${group[0].terms[0].tA ? "t" : "n"}${group[0].terms[0].tB ? "t" : "n"}` as ShaderName)
      : "matmuls";
    const ops: Bound[] = table.map((t) => ({ buffer: t.buffer, offset: t.lo, size: t.hi - t.lo, elem: 0 }));
    // the unused bindings: disjoint slices of a small engine-owned buffer (writable bindings may not overlap)
    this.spare ??= this.device.createBuffer({ size: this.align * MM_BUFFERS, usage: USAGE.STORAGE });
    for (let i = ops.length; i < MM_BUFFERS; i++)
      ops.push({ buffer: this.spare, offset: i * this.align, size: 16, elem: 0 });
    ops.push(this.partsOf(partial));
    const x = Math.min(groups, MAX_GROUPS);
    this.dispatch(name as "matmuls", ops, withZeros(name, v) as ParamsOf<"matmuls">, [x, Math.ceil(groups / x)]);
    if (split.length > 0)
      this.dispatch(
        "matmul_reduce",
        ops,
        withZeros("matmul_reduce", r) as ParamsOf<"matmul_reduce">,
        WebgpuEngine.grid(elems),
      );
    return true;
  }

  /** The deferred weight gradients of rmsnormBackward that an operand's range holds, recorded now (flushNorms). */
  private flushFor(ops: Bound[]): void {
    if (this.pendingNorms.length > 0) {
      const hit = ops.some((o) =>
        this.pendingNorms.some(
          (p) =>
            p.dw.buffer === o.buffer &&
            o.offset + 4 * o.elem < p.dw.offset + 4 * (p.dw.elem + p.D) &&
            p.dw.offset + 4 * p.dw.elem < o.offset + o.size,
        ),
      );
      if (hit) this.flushNorms();
    }
  }

  /**
   * The pending rmsnormBackward weight gradients: dw += their partials' column sums, one rmsnormBackwardW dispatch
   * for all of them (or one per span of a dw buffer that one binding can hold), the sets in call order.
   */
  private flushNorms(): void {
    const sets = this.pendingNorms;
    if (sets.length === 0) return;
    this.pendingNorms = [];
    const part = this.own(this.part!, this.part!.size / 4);
    this.partAt = 0;
    const abs = (b: Bound) => b.offset + 4 * b.elem;
    const groups: { lo: number; hi: number; sets: typeof sets }[] = [];
    for (const st of sets) {
      const a = abs(st.dw),
        end = a + 4 * st.D;
      const g = groups.find((x) => {
        if (x.sets[0].dw.buffer !== st.dw.buffer) return false;
        const lo = Math.floor(Math.min(x.lo, a) / this.align) * this.align;
        return Math.max(x.hi, end) - lo <= this.maxBinding;
      });
      if (g) {
        g.lo = Math.min(g.lo, a);
        g.hi = Math.max(g.hi, end);
        g.sets.push(st);
      } else groups.push({ lo: a, hi: end, sets: [st] });
    }
    for (const g of groups) {
      const lo = Math.floor(g.lo / this.align) * this.align;
      const dw: Bound = { buffer: g.sets[0].dw.buffer, offset: lo, size: Math.max(4, g.hi - lo), elem: 0 };
      const words = g.sets.flatMap((st) => [(abs(st.dw) - lo) / 4, st.pOff, st.nb, st.D]);
      const oT = this.table(words);
      const maxD = Math.max(...g.sets.map((st) => st.D));
      this.dispatch("rmsnormBackwardW", [dw, part, this.own(this.tables!, this.tablesAt)], { S: g.sets.length, oT }, [
        Math.ceil(maxD / WG),
        g.sets.length,
      ]);
    }
  }

  /** The element of `words` in the set-table buffer: written once (a new range, read by no command yet), then kept. */
  private table(words: number[]): number {
    const key = words.join(",");
    const found = this.tableAt.get(key);
    if (found !== undefined && this.tables) return found;
    const cap = this.tables ? this.tables.size / 4 : 0;
    if (!this.tables || this.tablesAt + words.length > cap) {
      if (this.tables) this.temps.push(this.tables); // destroyed once the commands that use it are submitted
      this.tables = this.device.createBuffer({
        size: 4 * Math.max(1 << 14, 2 * words.length),
        usage: USAGE.STORAGE | USAGE.COPY_DST,
      });
      this.tablesAt = 0;
      this.tableAt.clear();
    }
    const at = this.tablesAt;
    this.device.queue.writeBuffer(this.tables, 4 * at, Uint32Array.from(words));
    this.tablesAt += words.length;
    this.tableAt.set(key, at);
    return at;
  }

  /**
   * Room for `floats` more partials of rmsnormBackward. When they do not fit, the pending sets are flushed and the
   * buffer grows to twice what was asked of it (up to the binding limit), so that a backward's sets soon fit at once.
   */
  private partials(floats: number): number {
    const cap = this.part ? this.part.size / 4 : 0,
      want = this.partAt + floats;
    if (want > cap) {
      this.flushNorms();
      if (floats > cap) this.bindable(4 * floats);
      if (floats > cap || this.part === null || 2 * want <= Math.floor(this.maxBinding / 4)) {
        if (this.part) this.temps.push(this.part); // destroyed once the commands that use it are submitted
        this.part = this.device.createBuffer({
          size: 4 * Math.max(floats, Math.min(Math.floor(this.maxBinding / 4), 2 * want)),
          usage: USAGE.STORAGE,
        });
      }
    }
    const at = this.partAt;
    this.partAt += floats;
    return at;
  }

  /**
   * The occurrence lists of ids[0..N) (embeddingBackward's shader): U distinct tokens in order of first
   * occurrence, U+1 starts, then the rows of each token in n order; bound as an input, a new range of the host
   * array per call between two settles (an input is uploaded once per settle).
   */
  private occurrences(ids: Int32Array, N: number): { csr: Bound; U: number } {
    const slot = new Map<number, number>();
    const count: number[] = [];
    const tok: number[] = [];
    for (let n = 0; n < N; n++) {
      const t = ids[n];
      let u = slot.get(t);
      if (u === undefined) {
        slot.set(t, (u = tok.length));
        tok.push(t);
        count.push(0);
      }
      count[u]++;
    }
    const U = tok.length,
      need = 2 * U + 1 + N;
    if (this.csrEpoch !== this.epoch) {
      this.csrEpoch = this.epoch;
      this.csrAt = 0;
    }
    if (this.csrAt + need > this.csr.length) {
      this.csr = new Int32Array(Math.max(1 << 14, 2 * need));
      this.csrAt = 0;
    }
    const c = this.csr.subarray(this.csrAt, this.csrAt + need);
    this.csrAt += need;
    c.set(tok);
    let at = 0;
    for (let u = 0; u < U; u++) {
      c[U + u] = at;
      at += count[u];
    }
    c[2 * U] = at;
    const next = c.slice(U, 2 * U);
    for (let n = 0; n < N; n++) {
      const u = slot.get(ids[n]) as number;
      c[2 * U + 1 + next[u]++] = n;
    }
    return { csr: this.bind(c, "r"), U };
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
      matmul: (tA, tB, M, N, K, alpha, A, B, beta, C) =>
        this.matmuls([{ C, beta, terms: [{ tA, tB, M, N, K, alpha, A, B }] }]),
      matmuls: (jobs) => this.matmuls(jobs),
      embeddingForward: (out, ids, E, N, D) => {
        const i = bindR(ids),
          t = bindR(E),
          o = this.bind(out, "w");
        d("embeddingForward", [o, i, t], { n: N * D, D, oO: e(o), oI: e(i), oE: e(t) }, grid(N * D));
      },
      embeddingBackward: (dE, ids, dout, N, D) => {
        if (N === 0 || D === 0) return;
        const { csr, U } = this.occurrences(ids, N),
          g = bindR(dout),
          o = this.bind(dE, "rw");
        const f = { n: U * D, U, D, oE: e(o), oC: e(csr), oD: e(g) };
        d("embeddingBackward", [o, csr, g], f, grid(U * D));
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
        if (N === 0 || D === 0) return;
        const g = bindR(dout),
          xb = bindR(x),
          wb = bindR(w),
          r = bindR(rstd),
          o = this.bind(dx, "rw"),
          ow = this.bind(dw, "rw"); // written by the deferred rmsnormBackwardW (flushNorms)
        // one dispatch adds each dw once: a dw already pending (or too many sets) is flushed first
        const a = ow.offset + 4 * ow.elem;
        if (
          this.pendingNorms.length >= MAX_GROUPS ||
          this.pendingNorms.some(
            (p) =>
              p.dw.buffer === ow.buffer &&
              a < p.dw.offset + 4 * (p.dw.elem + p.D) &&
              p.dw.offset + 4 * p.dw.elem < a + 4 * D,
          )
        )
          this.flushNorms();
        const R = rmsnormRows(N),
          nb = Math.ceil(N / R),
          pOff = this.partials(nb * D),
          pb = this.own(this.part!, this.part!.size / 4);
        const f = { N, D, R, oDX: e(o), oP: pOff, oDO: e(g), oX: e(xb), oW: e(wb), oR: e(r) };
        d("rmsnormBackward", [o, pb, g, xb, wb, r], f, grid(nb, 1));
        this.pendingNorms.push({ dw: ow, pOff, nb, D });
      },
      ropeForward: (x, cos, sin, B, T, nh, E) => this.rope(x, cos, sin, B, T, nh, E, 1),
      ropeBackward: (x, cos, sin, B, T, nh, E) => this.rope(x, cos, sin, B, T, nh, E, -1),
      ropeQK: (q, kk, cos, sin, B, T, H, K, E, backward) => {
        const h = E / 2,
          c = bindR(cos),
          s = bindR(sin),
          oq = this.bind(q, "rw"),
          ok = this.bind(kk, "rw");
        const nq = B * T * H * h,
          nk = B * T * K * h;
        const f = { nq, nk, T, H, K, h, oQ: e(oq), oK: e(ok), oC: e(c), oS: e(s), sign: backward ? -1 : 1 };
        d("ropeQK", [oq, ok, c, s], f, grid(nq + nk));
      },
      attentionForward: (out, lse, q, k, v, B, T, H, K, E) => {
        attentionFits(E);
        const qb = bindR(q),
          kb = bindR(k),
          vb = bindR(v),
          o = this.bind(out, "w"),
          l = this.bind(lse, "w");
        d(
          "attentionForward",
          [o, l, qb, kb, vb],
          { T, H, K, E, oO: e(o), oL: e(l), oQ: e(qb), oK: e(kb), oV: e(vb), scale: 1 / Math.sqrt(E) },
          [Math.ceil(T / ATT_BQ), B * H],
        );
      },
      attentionBackward: (dq, dk, dv, dout, q, k, v, out, lse, B, T, H, K, E) => {
        attentionFits(E);
        const g = bindR(dout),
          qb = bindR(q),
          kb = bindR(k),
          vb = bindR(v),
          ob = bindR(out),
          l = bindR(lse),
          oq = this.bind(dq, "w"),
          ok = this.bind(dk, "w"),
          ov = this.bind(dv, "w");
        const f = {
          B,
          T,
          H,
          K,
          E,
          oDQ: e(oq),
          oDK: e(ok),
          oDV: e(ov),
          oDO: e(g),
          oQ: e(qb),
          oK: e(kb),
          oV: e(vb),
          oO: e(ob),
          oL: e(l),
          scale: 1 / Math.sqrt(E),
        };
        // the key blocks of each kv head (dk, dv), then the query blocks of each head (dq): one workgroup each
        const blocks = Math.ceil(T / ATT_BQ) * B * (K + H);
        d("attentionBackward", [oq, ok, ov, g, qb, kb, vb, ob, l], f, grid(blocks, 1));
      },
      attentionCachedForward: (out, q, kCache, vCache, P, T, H, K, E) => {
        attentionFits(E);
        const qb = bindR(q),
          kb = bindR(kCache),
          vb = bindR(vCache),
          o = this.bind(out, "w");
        d(
          "attentionCachedForward",
          [o, qb, kb, vb],
          { P, T, H, K, E, oO: e(o), oQ: e(qb), oK: e(kb), oV: e(vb), scale: 1 / Math.sqrt(E) },
          [Math.ceil(T / ATT_BQ), H],
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
          x = this.bind(logits, gradScale > 0 ? "rw" : "r"),
          l = this.lossRows(rows);
        this.losses.push({ buf: l.buffer, at: l.elem, rows, targeted });
        const f = { rows, V, oX: e(x), oT: e(t), oL: e(l), gs: gradScale };
        d("crossEntropy", [x, t, l], f, grid(rows, 1));
        return 0; // deferred: settle() returns the loss
      },
      copy: (dst, src) => {
        if (dst.length !== src.length) throw new RangeError(`copy: ${dst.length} floats from ${src.length}`);
        const s = bindR(src),
          o = this.bind(dst, "w");
        d("copy", [o, s], { n: src.length, oD: e(o), oS: e(s) }, grid(src.length));
      },
      fill: (x, value) => {
        const m = this.mirrorOf(x) as Mirror;
        if (
          value === 0 &&
          !m.onDevice &&
          !m.weights &&
          !m.constant &&
          x.byteOffset === m.start &&
          x.byteLength === m.end - m.start
        ) {
          // a whole host array zeroed (a rank's gradient arrays at start): cleared in the command stream, whatever
          // its size (no binding), never uploaded
          this.copyEncoder().clearBuffer(m.gpu, 0, m.end - m.start);
          m.onDevice = true;
          return;
        }
        const o = this.bind(x, "w");
        d("fill", [o], { n: x.length, oD: e(o), value }, grid(x.length));
      },
      weightsAre: (params) => this.weightsAre(params),
      weightsChanged: () => this.weightsChanged(),
      constant: (a) => this.constant(a),
      traffic: () => structuredClone(this.counts),
      // the logits of one chunk in one binding (at most 1 GiB): fewer chunks, fewer dispatches
      headChunkTokens: (V) =>
        Math.max(Math.floor((1 << 24) / V), Math.floor(Math.min(this.maxBinding, 1 << 30) / (4 * V))),
      settle: (readback, opts) => {
        this.flushNorms(); // before the readback, in the command stream
        return this.settle(readback, opts);
      },
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
  private constant(a: Float32Array): void {
    const m = this.mirrorOf(a) as Mirror;
    if (m.weights) throw new Error("webgpu: constant() on the master weights");
    if (m.onDevice) throw new Error("webgpu: constant() on an array a kernel wrote");
    if (!m.constant) {
      m.constant = true;
      m.dirty = true;
    }
  }

  /** `rows` floats of the loss buffer for one crossEntropy call (the buffer grows; a replaced one lives until settle). */
  private lossRows(rows: number): Bound {
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
    return { buffer: this.lossBuf, offset, size, elem: (at * 4 - offset) / 4 };
  }

  /** Every weights mirror re-uploads before its next read (a WeakMap cannot be walked: they are listed). */
  private weightsChanged(): void {
    for (const m of this.weightList) m.dirty = true;
  }

  /**
   * Submits everything queued and resolves once it has run: each array of `readback` that a kernel wrote is read
   * into host memory, and the mean loss of the crossEntropy rows since the last settle. With `clear`, each such
   * array is then zeroed on the device and stays device-owned (kernels.ts). The host may go on recording kernels
   * before it resolves: the readback is in the command stream, so it sees the kernels before it and none after.
   */
  private async settle(readback: Float32Array[], opts: SettleOptions = {}): Promise<{ loss: number; rows: number }> {
    this.epoch++;
    const jobs: { m: Mirror; staging: GpuBuffer }[] = [];
    const seen = new Set<Mirror>();
    for (const a of readback) {
      const m = this.mirrorOf(a, false);
      if (!m || seen.has(m)) continue;
      seen.add(m);
      if (m.onDevice) {
        const staging = this.stagingOf(Math.max(4, m.end - m.start));
        this.copyEncoder().copyBufferToBuffer(m.gpu, 0, staging, 0, m.end - m.start);
        this.counts.down.arrays += m.end - m.start;
        jobs.push({ m, staging });
      }
      if (opts.clear && !m.weights && !m.constant) {
        this.copyEncoder().clearBuffer(m.gpu);
        m.onDevice = true;
      }
    }
    const losses = this.losses;
    this.losses = [];
    this.lossAt = 0;
    const lossRows = losses.reduce((s, l) => s + l.rows, 0);
    let lossStaging: GpuBuffer | null = null;
    if (lossRows > 0) {
      lossStaging = this.stagingOf(lossRows * 4);
      let at = 0;
      for (const l of losses) {
        this.copyEncoder().copyBufferToBuffer(l.buf, l.at * 4, lossStaging, at, l.rows * 4);
        at += l.rows * 4;
      }
      this.counts.down.loss += lossRows * 4;
    }
    this.temps.push(...this.lossRetired.splice(0));
    this.submit();
    const profiled = this.prof ? this.prof.pending.splice(0) : [];
    await Promise.all([...jobs.map((j) => j.staging.mapAsync(MAP_READ)), lossStaging?.mapAsync(MAP_READ), ...profiled]);
    if (this.error) throw new Error(`webgpu: ${this.error}`);
    for (const { m, staging } of jobs) {
      new Uint8Array(m.host, m.start, m.end - m.start).set(
        new Uint8Array(staging.getMappedRange(), 0, m.end - m.start),
      );
      staging.unmap();
      this.release(staging);
      if (!opts.clear) m.onDevice = false;
    }
    let sum = 0,
      rows = 0;
    if (lossStaging) {
      const v = new Float32Array(lossStaging.getMappedRange(), 0, lossRows);
      for (let i = 0; i < lossRows; i++) sum += v[i];
      lossStaging.unmap();
      this.release(lossStaging);
      rows = losses.reduce((s, l) => s + l.targeted, 0);
    }
    return { loss: rows > 0 ? sum / rows : 0, rows };
  }

  /** Profile mode: each shader's dispatches and device time so far (settle() brings the times in). */
  profile(): Map<string, { calls: number; ms: number }> {
    if (!this.prof) throw new Error("webgpu: the engine was made without profile");
    return new Map(this.prof.totals);
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

/**
 * The engine in profile mode (the bench's webgpu case): every dispatch timed by timestamp queries, `profile()`
 * giving each shader's calls and device milliseconds; or why it cannot run (no adapter, or no timestamp-query).
 */
export async function createProfiledWebgpuKernels(): Promise<
  { kernels: Kernels; profile: () => Map<string, { calls: number; ms: number }> } | WebgpuUnavailable
> {
  const d = await openDevice();
  if ("reason" in d) return d;
  if (!d.device.features?.has("timestamp-query"))
    return { reason: `${d.name} offers no timestamp-query`, fix: "run the profile on an adapter that has it" };
  const engine = new WebgpuEngine(d.device, d.name, { profile: true });
  return { kernels: engine.kernels(), profile: () => engine.profile() };
}

/** This thread's adapter and device, opened as the engine opens them (the bench's peak probe). */
export async function openWebgpuDevice(): Promise<{ device: GpuDevice; name: string } | WebgpuUnavailable> {
  return openDevice();
}

/**
 * The webgpu engine on a given device, its kernels and its dispatch, for tests: a recording device
 * (model.webgpu-params.test.ts), or a real one with `shaders` replacing some shaders' WGSL (a planted defect,
 * model.webgpu.test.ts). Runs never pass `shaders`.
 */
export function webgpuEngineOn(
  device: GpuDevice,
  name: string,
  opts: Omit<EngineOptions, "profile"> = {},
): { kernels: Kernels; dispatch: WebgpuEngine["dispatch"] } {
  const engine = new WebgpuEngine(device, name, opts);
  return { kernels: engine.kernels(), dispatch: engine.dispatch.bind(engine) };
}
