/**
 * The WGSL framework of the webgpu engine (../engine.ts): one compute shader per kernel of the Kernels interface
 * (kernels.ts), by family in this folder (matmul.ts, rows.ts, attention.ts, fold.ts; every one by name in catalog.ts).
 *
 * Every array is a storage binding of a range of a device mirror of a host array, with an element offset (`o*`)
 * into it in the shader's settings. Each shader declares its storage arrays, each with its access (`read` where
 * the shader only reads it, else `read_write`), and its settings by name (shader()): the binding lines and the WGSL
 * `struct P` are written from those lists, and the host passes the settings as an object keyed by the same names
 * (packParams), so no list of numbers has to match a field order. WebGPU lets one buffer back several storage
 * bindings of a dispatch only when all of them are writable (and their ranges do not overlap), so a dispatch whose
 * `read` array shares its device buffer with a written one runs a variant in which that array is read_write
 * (withWritable; the recorder picks it).
 *
 * Bounds and workgroup memory (the device is opened without Dawn's robustness and workgroup-memory zeroing,
 * device.ts): every shader checks its own bounds against its settings (each thread's index against the count it
 * covers, a row against the rows, a tile's rows and columns against the shape), so no thread reads or writes
 * outside the ranges its settings describe, which the host binds whole (test/model.webgpu-bounds.test.ts binds
 * more and checks the guard past each range); its private and workgroup arrays are indexed within their sizes by
 * construction (attention's by the head size, at most ATT_EMAX: the engine refuses a larger one); and every shader
 * that has workgroup memory writes each element it reads before a barrier that precedes the read (the tree sums'
 * red[] and the matmul's As/Bs tiles, said at their declarations; attention's tiles, said at tileIn, and its lse row).
 * float32 throughout. Deterministic by construction: no atomics, every sum runs in one fixed order (a thread's
 * own loop, or a workgroup's fixed tree), so the same inputs give the same bits on one device, run to run.
 * Elementwise kernels index a 1-D range over a 2-D grid (x * 256 per row of the grid; the host splits past 65535
 * workgroups); row kernels take one workgroup per row (rmsnormBackward one per block of rows). Column sums over
 * rows run in parallel blocks whose partials are summed in block order (rmsnormBackwardW), or per distinct token
 * (embeddingBackward), never one thread down all N rows. Attention is fused, FlashAttention-2's scheme as the native
 * engine's (native/ops/attention.c): tiles in workgroup memory, an online softmax, a backward that recomputes the
 * probabilities from the saved log-sum-exp; no buffer of T x T floats, each workgroup owning its outputs.
 */

/** Threads per workgroup of the elementwise and per-row kernels. */
export const WG = 256;

/** The 1-D index of a thread over a 2-D grid, and a workgroup's row: the elementwise and row kernels' prologues. */
export const idx = `fn flat(g: vec3u, n: vec3u) -> u32 { return g.x + g.y * n.x * ${WG}u; }`;
export const row = `fn rowOf(w: vec3u, n: vec3u) -> u32 { return w.x + w.y * n.x; }`;

/** A shader setting's WGSL type: u32 (a size, a flag, an element offset) or f32 (a scale, eps, a value). */
export type ParamType = "u32" | "f32";
/** A shader's settings, by name, in the order of its WGSL `struct P`. */
export type ParamList = Readonly<Record<string, ParamType>>;
/** A dispatch's settings: one number per name of the shader's ParamList, no other. */
export type ParamValues<P extends ParamList = ParamList> = { readonly [K in keyof P]: number };

/** A storage array's access: `read` where the shader only reads it (a read-only-storage binding), else `read_write`. */
export type Access = "read" | "read_write";

/** One compute shader: its storage arrays, its settings by name, and its WGSL, whose `struct P` is made from `params`. */
export interface Shader<P extends ParamList = ParamList> {
  /** Binding i is storage array bindings[i]: "name:access" (f32) or "name:access:type" (access: read, read_write). */
  readonly bindings: readonly string[];
  /** Each binding's access, as declared. */
  readonly access: readonly Access[];
  /** The uniform `p` (binding bindings.length): struct P's fields, in this order, each 4 bytes. */
  readonly params: P;
  readonly code: string;
}

/**
 * A shader from its storage arrays, its settings and the rest of its WGSL: the binding lines and `struct P` are
 * written here from the two lists, so a setting's place in the uniform is its place in `params`, which
 * packParams reads too. Names are WGSL identifiers (never integer-like, so an object keeps their order).
 */
export function shader<const P extends ParamList>(bindings: readonly string[], params: P, body: string): Shader<P> {
  const names = Object.keys(params);
  const parts = bindings.map((b) => b.split(":"));
  for (const n of [...names, ...parts.map((b) => b[0])])
    if (!/^[A-Za-z_]\w*$/.test(n)) throw new Error(`webgpu: ${JSON.stringify(n)} is no WGSL identifier`);
  const access = parts.map(([name, a]) => {
    if (a !== "read" && a !== "read_write")
      throw new Error(`webgpu: storage array ${name} declares no access ("${name}:read" or "${name}:read_write")`);
    return a as Access;
  });
  const storage = parts.map(([name, a, type = "f32"], i) => `${bindingLine(i, a as Access)} ${name}: array<${type}>;`);
  const struct = `struct P { ${names.map((n) => `${n}: ${params[n]}`).join(", ")} }`;
  const uniform = `@group(0) @binding(${bindings.length}) var<uniform> p: P;`;
  return { bindings, access, params, code: `${storage.join("\n")}\n${struct}\n${uniform}\n${body}` };
}

/** The start of storage binding i's declaration with `access`. */
function bindingLine(i: number, access: Access): string {
  return `@group(0) @binding(${i}) var<storage, ${access}>`;
}

/**
 * `code` (a shader's WGSL, or a test's replacement of it) with the `read` bindings `writable` declared read_write:
 * the variant for a dispatch in which those arrays share a device buffer with a written one (WebGPU refuses a buffer
 * bound both read-only and writable in one dispatch). Nothing else changes.
 */
export function withWritable(code: string, writable: readonly number[]): string {
  let out = code;
  for (const i of writable) {
    const from = bindingLine(i, "read");
    if (!out.includes(from)) throw new Error(`webgpu: no read-only storage binding ${i} to make writable`);
    out = out.replace(from, bindingLine(i, "read_write"));
  }
  return out;
}

/**
 * The uniform buffer of one dispatch of `name`: each setting at 4 bytes times its place in the shader's params
 * (u32 or f32 as declared), the size rounded up to 16. Throws on a name the shader lacks, a name it has that
 * `values` lacks, and a u32 that is not an integer in [0, 2^32).
 */
export function packParams(name: string, s: Shader, values: Readonly<Record<string, number>>): ArrayBuffer {
  const names = Object.keys(s.params);
  const extra = Object.keys(values).filter((n) => !Object.hasOwn(s.params, n));
  const missing = names.filter((n) => !Object.hasOwn(values, n));
  if (extra.length || missing.length)
    throw new Error(
      `webgpu: ${name} takes settings ${names.join(", ")}; ${[missing.length ? `missing ${missing.join(", ")}` : "", extra.length ? `unknown ${extra.join(", ")}` : ""].filter((x) => x).join("; ")}`,
    );
  const raw = new ArrayBuffer(Math.max(16, Math.ceil((names.length * 4) / 16) * 16));
  const u32 = new Uint32Array(raw),
    f32 = new Float32Array(raw);
  names.forEach((n, i) => {
    const v = values[n];
    if (typeof v !== "number") throw new TypeError(`webgpu: ${name} setting ${n} = ${String(v)} is no number`);
    if (s.params[n] === "f32") f32[i] = v;
    else if (!Number.isInteger(v) || v < 0 || v > 0xffffffff)
      throw new RangeError(`webgpu: ${name} setting ${n} = ${v} is no u32`);
    else u32[i] = v;
  });
  return raw;
}
