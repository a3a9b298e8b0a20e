/**
 * The webgpu engine's device (engine.ts ties the engine together): Dawn's Node binding (the optional npm package
 * `webgpu`, which loads libvulkan.so.1 at run time), loaded here and nowhere else; the adapter, its facts for the
 * start line and the device opened with the limits, features and Dawn toggles the engine asks for (openWebgpuDevice:
 * the one place a device is opened), on the GPU a rank was given (gpus.ts: the host's GPUs and how each is chosen);
 * the child-process probe the main thread refuses `--backend webgpu` with (P1); and the advice when no adapter opens.
 *
 * Dawn's toggles (its create() flags, applied to each device): robustness off (`disable_robustness`: every shader
 * checks its own bounds, shaders/framework.ts) and workgroup memory not zeroed (`disable_workgroup_init`: every
 * shader writes workgroup memory before reading it, each says where); in profile mode timestamps unquantised
 * (`timestamp_quantization` off). None of them changes a result's bits.
 */
import * as fs from "node:fs";
import * as path from "node:path";
import { spawnSync } from "node:child_process";
import { isMainThread } from "node:worker_threads";
import { type GpuListing, type GpuSelect, listHostGpus, withDeviceEnv } from "./gpus";

// ------------------------------------------------------------------ the slice of the WebGPU API used here
// (declared here, not taken from @webgpu/types, so the project type-checks without the optional package)

export interface GpuBuffer {
  readonly size: number;
  destroy(): void;
  getMappedRange(): ArrayBuffer;
  unmap(): void;
  mapAsync(mode: number): Promise<void>;
}
export interface GpuBinding {
  binding: number;
  resource: { buffer: GpuBuffer; offset?: number; size?: number };
}
export interface GpuPass {
  setPipeline(p: unknown): void;
  setBindGroup(i: number, g: unknown): void;
  dispatchWorkgroups(x: number, y?: number, z?: number): void;
  end(): void;
}
export interface GpuTimestampWrites {
  querySet: unknown;
  beginningOfPassWriteIndex: number;
  endOfPassWriteIndex: number;
}
export interface GpuEncoder {
  beginComputePass(d?: { timestampWrites?: GpuTimestampWrites }): GpuPass;
  copyBufferToBuffer(src: GpuBuffer, so: number, dst: GpuBuffer, d: number, size: number): void;
  clearBuffer(b: GpuBuffer, offset?: number, size?: number): void;
  resolveQuerySet(q: unknown, first: number, count: number, dst: GpuBuffer, offset: number): void;
  finish(): unknown;
}
export interface GpuPipeline {
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
  createComputePipeline(d: {
    layout: "auto";
    compute: { module: unknown; entryPoint: string; constants?: Record<string, number> };
  }): GpuPipeline;
  createBindGroup(d: { layout: unknown; entries: GpuBinding[] }): unknown;
  createQuerySet?(d: { type: "timestamp"; count: number }): unknown;
  createCommandEncoder(): GpuEncoder;
  destroy(): void;
}
export interface GpuAdapter {
  readonly limits: Record<string, number>;
  readonly features: { has(f: string): boolean };
  readonly info?: { vendor?: string; architecture?: string; device?: string; description?: string };
  requestDevice(d: { requiredLimits: Record<string, number>; requiredFeatures?: string[] }): Promise<GpuDevice>;
}
export interface Gpu {
  requestAdapter(o?: { powerPreference?: string }): Promise<GpuAdapter | null>;
}

/** Buffer usages (WebGPU's GPUBufferUsage) and the map mode a readback waits for. */
export const USAGE = {
  MAP_READ: 0x1,
  COPY_SRC: 0x4,
  COPY_DST: 0x8,
  UNIFORM: 0x40,
  STORAGE: 0x80,
  QUERY_RESOLVE: 0x200,
} as const;
export const MAP_READ = 1;
/** The features the engine asks for where the adapter has them: timing (the bench's profile), and two it reports. */
const WANTED_FEATURES = ["timestamp-query", "subgroups", "shader-f16"] as const;

// ------------------------------------------------------------------ loading Dawn

/** Why the engine cannot run here, and the command that fixes it. */
export interface WebgpuUnavailable {
  reason: string;
  fix: string;
}

const INSTALL_PACKAGE = "npm install webgpu@0.6.2";
const DRIVER_VENDOR =
  "install a Vulkan driver: your GPU vendor's (NVIDIA in a container: NVIDIA_DRIVER_CAPABILITIES must include graphics), or the software adapter on Debian 12: ";
/** The script that installs Mesa 25 from bookworm-backports (it reads apt's sources for the mirror: the one reading). */
const MESA_SCRIPT = path.join("scripts", "mesa-backports.sh");

/**
 * How to get a Vulkan driver here: the GPU vendor's, or the software adapter, Mesa 25 from bookworm-backports, by
 * scripts/mesa-backports.sh (docs/webgpu.md shows the same command): its path from the working directory when the
 * checkout is under it, else in full.
 */
export function installDriverAdvice(): string {
  let root = __dirname;
  while (!fs.existsSync(path.join(root, MESA_SCRIPT)) && path.dirname(root) !== root) root = path.dirname(root);
  const script = path.join(root, MESA_SCRIPT);
  const rel = path.relative(process.cwd(), script);
  const cmd = !fs.existsSync(script) ? MESA_SCRIPT : rel.startsWith("..") || path.isAbsolute(rel) ? script : rel;
  return `${DRIVER_VENDOR}${cmd} (as root; it adds bookworm-backports of the Debian mirror apt installs from)`;
}

/** Dawn's `create` from the package's prebuilt dawn.node (required directly: the package's index is an ES module). */
export function loadDawn(): { create: (flags: string[]) => Gpu } | WebgpuUnavailable {
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

/** Dawn's toggles on every device: its robustness and workgroup-memory zeroing off (the header says why). */
const TOGGLES_ON = ["disable_robustness", "disable_workgroup_init"] as const;

/** The create() flags of a device: the toggles, timestamps unquantised in profile mode, and the GPU's adapter= name. */
export function dawnFlags(opts: { profile?: boolean; gpu?: GpuSelect | null }): string[] {
  const flags = [`enable-dawn-features=${TOGGLES_ON.join(",")}`];
  if (opts.profile) flags.push("disable-dawn-features=timestamp_quantization");
  if (opts.gpu?.adapter) flags.push(`adapter=${opts.gpu.adapter}`);
  return flags;
}

/** What openWebgpuDevice opens: the device, on which GPU, and with what. */
export interface WebgpuOptions {
  /** Profile mode: timestamps unquantised. */
  profile?: boolean;
  /**
   * The GPU (gpus.ts): its device-select variables must be in the environment while the instance enumerates. On
   * the main thread they are set here; a rank thread's are set by the main thread around its start (coordinator.ts).
   */
  gpu?: GpuSelect | null;
}

/**
 * This thread's adapter and its device, opened with the limits, features and toggles the engine asks for, on the
 * GPU it was given (else Dawn's first), and the adapter in words; or why there is none. The one place a device is
 * opened: the engine, the probe, and the bench's peak probe and bench/gpu-rank.ts's adapter check.
 */
export async function openWebgpuDevice(
  opts: WebgpuOptions = {},
): Promise<{ adapter: GpuAdapter; device: GpuDevice; name: string } | WebgpuUnavailable> {
  const dawn = loadDawn();
  if ("reason" in dawn) return dawn;
  const gpu = dawn.create(dawnFlags(opts));
  // The GPU object must stay reachable, or a later mapAsync crashes the process (SIGSEGV / futex error).
  const g = globalThis as { __tstrainWebgpu?: unknown[] };
  (g.__tstrainWebgpu ??= []).push(gpu);
  // the instance enumerates its devices at its first requestAdapter: the device-select layer reads its variables then
  const restore = isMainThread && opts.gpu ? withDeviceEnv(opts.gpu.env) : () => {};
  let adapter: GpuAdapter | null;
  try {
    adapter = await gpu.requestAdapter({ powerPreference: "high-performance" }).catch((e: unknown) => {
      if (!opts.gpu?.adapter) throw e;
      return null; // adapter= matched none
    });
  } finally {
    restore();
  }
  if (!adapter)
    return {
      reason:
        opts.gpu?.index !== undefined && opts.gpu.index >= 0
          ? `${opts.gpu.label} gives Dawn no WebGPU adapter (its Vulkan driver lacks what Dawn needs, or it is gone)`
          : "Dawn found no WebGPU adapter (no Vulkan driver with the features it needs: Mesa before 25's lavapipe lacks them)",
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
 * Whether a WebGPU adapter opens here (on `gpu`, else Dawn's first), asked synchronously in a child process (the
 * main thread refuses `--backend webgpu` before any work, P1, and an adapter is only reachable through promises).
 */
export function probeWebgpuSync(gpu: GpuSelect | null = null): { name: string } | WebgpuUnavailable {
  const dawn = loadDawn();
  if ("reason" in dawn) return dawn;
  const env: NodeJS.ProcessEnv = { ...process.env };
  for (const [k, v] of Object.entries(gpu?.env ?? {})) {
    if (v === null) delete env[k];
    else env[k] = v;
  }
  const arg = JSON.stringify(gpu ? { ...gpu, env: {} } : null);
  const r = spawnSync(process.execPath, ["-e", `require(${JSON.stringify(__filename)}).printWebgpuProbe(${arg})`], {
    encoding: "utf8",
    timeout: 60_000,
    env,
  });
  const line = (r.stdout ?? "").split("\n").find((l) => l.startsWith("WEBGPU_PROBE "));
  if (!line)
    return {
      reason: `the adapter probe ended without an answer (status ${r.status}${r.signal ? `, ${r.signal}` : ""}): ${(r.stderr ?? "").trim().split("\n").slice(-1)[0] ?? ""}`,
      fix: installDriverAdvice(),
    };
  return JSON.parse(line.slice("WEBGPU_PROBE ".length)) as { name: string } | WebgpuUnavailable;
}

/** The child's side of probeWebgpuSync: one line, `WEBGPU_PROBE {json}` (its environment holds the GPU's variables). */
export async function printWebgpuProbe(gpu: GpuSelect | null = null): Promise<void> {
  const d = await openWebgpuDevice({ gpu });
  if ("reason" in d) process.stdout.write(`WEBGPU_PROBE ${JSON.stringify(d)}\n`);
  else {
    process.stdout.write(`WEBGPU_PROBE ${JSON.stringify({ name: d.name })}\n`);
    d.device.destroy();
  }
}

/**
 * The host's GPUs (gpus.ts listHostGpus): Dawn loaded in a child process whose device-select layer prints them;
 * null fields and a reason where Dawn does not load.
 */
export function listWebgpuGpus(): GpuListing {
  const dawn = loadDawn();
  if ("reason" in dawn) return { gpus: null, why: dawn.reason };
  return listHostGpus(`require(${JSON.stringify(__filename)}).enumerateOnce()`);
}

/** The listing child's side: an instance enumerates its devices (the layer, told to list them, prints and exits). */
export async function enumerateOnce(): Promise<void> {
  const dawn = loadDawn();
  if ("reason" in dawn) return;
  const gpu = dawn.create([]);
  (globalThis as { __tstrainWebgpu?: unknown[] }).__tstrainWebgpu = [gpu];
  await gpu.requestAdapter().catch(() => null);
}
