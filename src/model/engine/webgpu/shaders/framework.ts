/**
 * The WGSL framework of the webgpu engine (../engine.ts): one compute shader per kernel of the Kernels interface
 * (kernels.ts), by family in this folder (matmul.ts, rows.ts, attention.ts; every one by name in catalog.ts).
 *
 * Every array is a read_write storage binding (WebGPU lets one buffer back several storage bindings of a
 * dispatch only when all of them are writable) of a range of a device mirror of a host array, with an element
 * offset (`o*`) into it in the shader's settings. Each shader declares its storage arrays and its settings by name
 * (shader()): the binding lines and the WGSL `struct P` are written from those lists, and the host passes the
 * settings as an object keyed by the same names (packParams), so no list of numbers has to match a field order.
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

/** One compute shader: its storage arrays, its settings by name, and its WGSL, whose `struct P` is made from `params`. */
export interface Shader<P extends ParamList = ParamList> {
  /** Binding i is storage array bindings[i]: "name" (f32) or "name:type". */
  readonly bindings: readonly string[];
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
  for (const n of [...names, ...bindings.map((b) => b.split(":")[0])])
    if (!/^[A-Za-z_]\w*$/.test(n)) throw new Error(`webgpu: ${JSON.stringify(n)} is no WGSL identifier`);
  const storage = bindings.map((b, i) => {
    const [name, type = "f32"] = b.split(":");
    return `@group(0) @binding(${i}) var<storage, read_write> ${name}: array<${type}>;`;
  });
  const struct = `struct P { ${names.map((n) => `${n}: ${params[n]}`).join(", ")} }`;
  const uniform = `@group(0) @binding(${bindings.length}) var<uniform> p: P;`;
  return { bindings, params, code: `${storage.join("\n")}\n${struct}\n${uniform}\n${body}` };
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
