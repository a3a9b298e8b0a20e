/**
 * safetensors: 8-byte little-endian header length, a JSON header
 * {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {string: string}}, then the raw
 * little-endian tensor bytes, contiguous and without holes. Used for the fixtures, the M7 export and
 * the checkpoints (K2). Reading validates everything and names the tensor at fault.
 */
import * as fs from "node:fs";
import * as os from "node:os";
import { UserError } from "../errors";
import type { LlamaConfig } from "./llama-config";
import { paramLayout } from "./layout";

export type StDtype = "F32" | "F64" | "I32" | "I64" | "U8";
export interface StTensor {
  name: string;
  dtype: StDtype;
  shape: number[];
  data: Float32Array | Float64Array | Int32Array | BigInt64Array | Uint8Array;
}

const BYTES: Record<StDtype, number> = { F32: 4, F64: 8, I32: 4, I64: 8, U8: 1 };
const MAX_HEADER = 100 * 1024 * 1024;

if (os.endianness() !== "LE") throw new Error("safetensors.ts assumes a little-endian host");

function numel(shape: number[]): number {
  return shape.reduce((a, b) => a * b, 1);
}

function ctorFor(dtype: StDtype): { new (n: number): StTensor["data"] } {
  switch (dtype) {
    case "F32":
      return Float32Array;
    case "F64":
      return Float64Array;
    case "I32":
      return Int32Array;
    case "I64":
      return BigInt64Array;
    case "U8":
      return Uint8Array;
  }
}

function dtypeMatches(t: StTensor): boolean {
  const d = t.data;
  switch (t.dtype) {
    case "F32":
      return d instanceof Float32Array;
    case "F64":
      return d instanceof Float64Array;
    case "I32":
      return d instanceof Int32Array;
    case "I64":
      return d instanceof BigInt64Array;
    case "U8":
      return d instanceof Uint8Array;
  }
}

export function encodeSafetensors(tensors: StTensor[], metadata?: Record<string, string>): Buffer {
  const header: Record<string, unknown> = {};
  if (metadata && Object.keys(metadata).length > 0) {
    for (const [k, v] of Object.entries(metadata)) {
      if (typeof v !== "string") throw new TypeError(`safetensors metadata "${k}" must be a string, got ${typeof v}`);
    }
    header.__metadata__ = metadata;
  }
  let off = 0;
  const seen = new Set<string>();
  for (const t of tensors) {
    if (t.name === "__metadata__" || seen.has(t.name))
      throw new TypeError(`safetensors: tensor name "${t.name}" is reserved or repeated`);
    seen.add(t.name);
    if (!(t.dtype in BYTES)) throw new TypeError(`safetensors: tensor "${t.name}" has unsupported dtype ${t.dtype}`);
    if (!dtypeMatches(t))
      throw new TypeError(
        `safetensors: tensor "${t.name}" is declared ${t.dtype} but its data is a ${t.data.constructor.name}`,
      );
    if (t.shape.some((d) => !Number.isInteger(d) || d < 0) || numel(t.shape) !== t.data.length) {
      throw new TypeError(`safetensors: tensor "${t.name}" has shape [${t.shape}] but ${t.data.length} elements`);
    }
    const len = t.data.byteLength;
    header[t.name] = { dtype: t.dtype, shape: t.shape, data_offsets: [off, off + len] };
    off += len;
  }
  let h = Buffer.from(JSON.stringify(header), "utf8");
  const pad = (8 - (h.length % 8)) % 8; // the data starts 8-aligned, as the reference writer does
  if (pad) h = Buffer.concat([h, Buffer.alloc(pad, 0x20)]);
  const out = Buffer.allocUnsafe(8 + h.length + off);
  out.writeBigUInt64LE(BigInt(h.length), 0);
  h.copy(out, 8);
  let p = 8 + h.length;
  for (const t of tensors) {
    const src = Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength);
    src.copy(out, p);
    p += src.length;
  }
  return out;
}

export function decodeSafetensors(buf: Buffer): { tensors: Map<string, StTensor>; metadata: Record<string, string> } {
  const fail = (msg: string): never => {
    throw new UserError("M7", `not a valid safetensors file: ${msg}; re-export or re-download the file`);
  };
  if (buf.length < 8) fail(`${buf.length} bytes, shorter than the 8-byte header length`);
  const hl = buf.readBigUInt64LE(0);
  if (hl > BigInt(Math.min(MAX_HEADER, buf.length - 8)))
    fail(`header length ${hl} exceeds the file (${buf.length} bytes) or the 100 MB limit`);
  const hlen = Number(hl);
  let header: unknown;
  try {
    header = JSON.parse(buf.toString("utf8", 8, 8 + hlen));
  } catch (e) {
    fail(`the ${hlen}-byte JSON header does not parse (${(e as Error).message})`);
  }
  if (typeof header !== "object" || header === null || Array.isArray(header)) fail("the header is not a JSON object");
  const dataStart = 8 + hlen,
    dataLen = buf.length - dataStart;
  const metadata: Record<string, string> = {};
  const spans: { name: string; b: number; e: number }[] = [];
  const tensors = new Map<string, StTensor>();
  for (const [name, raw] of Object.entries(header as Record<string, unknown>)) {
    if (name === "__metadata__") {
      if (typeof raw !== "object" || raw === null) fail("__metadata__ is not an object");
      for (const [k, v] of Object.entries(raw as Record<string, unknown>)) {
        if (typeof v !== "string") fail(`__metadata__ "${k}" is not a string`);
        metadata[k] = v as string;
      }
      continue;
    }
    const info = raw as { dtype?: unknown; shape?: unknown; data_offsets?: unknown };
    if (typeof info !== "object" || info === null) fail(`tensor "${name}": entry is not an object`);
    const dtype = info.dtype as StDtype;
    if (typeof dtype !== "string" || !(dtype in BYTES))
      fail(`tensor "${name}": dtype ${JSON.stringify(info.dtype)} is not one of ${Object.keys(BYTES).join(", ")}`);
    const shape = info.shape;
    if (!Array.isArray(shape) || shape.some((d) => !Number.isInteger(d) || d < 0))
      fail(`tensor "${name}": shape ${JSON.stringify(shape)} is not a list of non-negative integers`);
    const offs = info.data_offsets;
    if (!Array.isArray(offs) || offs.length !== 2 || !offs.every((x) => Number.isInteger(x) && x >= 0))
      fail(`tensor "${name}": data_offsets ${JSON.stringify(offs)} is not [begin, end]`);
    const [b, e] = offs as [number, number];
    const n = numel(shape as number[]);
    if (e < b || e - b !== n * BYTES[dtype])
      fail(
        `tensor "${name}": data_offsets [${b}, ${e}] hold ${e - b} bytes, shape [${shape}] ${dtype} needs ${n * BYTES[dtype]}`,
      );
    if (e > dataLen)
      fail(`tensor "${name}": data_offsets end ${e} is past the data (${dataLen} bytes; the file is truncated?)`);
    spans.push({ name, b, e });
    const data = new (ctorFor(dtype))(n);
    buf.copy(Buffer.from(data.buffer, data.byteOffset, data.byteLength), 0, dataStart + b, dataStart + e);
    tensors.set(name, { name, dtype, shape: shape as number[], data });
  }
  spans.sort((x, y) => x.b - y.b || x.e - y.e);
  let at = 0;
  for (const s of spans) {
    if (s.b !== at)
      fail(`tensor "${s.name}" starts at byte ${s.b} but the previous tensor ends at ${at} (overlap or hole)`);
    at = s.e;
  }
  if (at !== dataLen) fail(`the tensors cover ${at} bytes but the data section has ${dataLen} (trailing bytes)`);
  return { tensors, metadata };
}

/** Written to path.tmp and renamed, so a crash never leaves a half-written file under the real name. */
export function writeSafetensors(path: string, tensors: StTensor[], metadata?: Record<string, string>): void {
  const tmp = `${path}.tmp`;
  const fd = fs.openSync(tmp, "w");
  try {
    fs.writeSync(fd, encodeSafetensors(tensors, metadata));
    fs.fsyncSync(fd);
  } finally {
    fs.closeSync(fd);
  }
  fs.renameSync(tmp, path);
}

export function readSafetensors(path: string): { tensors: Map<string, StTensor>; metadata: Record<string, string> } {
  try {
    return decodeSafetensors(fs.readFileSync(path));
  } catch (e) {
    if (e instanceof UserError) throw new UserError("M7", `${path}: ${e.message.replace(/ \[M7\]$/, "")}`);
    throw e;
  }
}

/** The flat layout as HF-named F32 tensors (copies, so the flat buffer may change afterwards). */
export function flatToTensors(c: LlamaConfig, flat: Float32Array): StTensor[] {
  const { entries, total } = paramLayout(c);
  if (flat.length !== total)
    throw new RangeError(`flatToTensors: flat has ${flat.length} floats, the layout needs ${total}`);
  return entries.map((e) => ({
    name: e.name,
    dtype: "F32" as const,
    shape: e.shape.slice(),
    data: flat.slice(e.offset, e.offset + e.size),
  }));
}

/**
 * Fills `out` (the flat layout) by HF names. Shapes must match; F64 is accepted and rounded to
 * float32. `lm_head.weight` is tolerated (tied: the embedding is the head); any other unknown or
 * missing name is refused, naming it.
 */
export function tensorsToFlat(c: LlamaConfig, t: Map<string, StTensor>, out: Float32Array): void {
  const { entries, total } = paramLayout(c);
  if (out.length !== total)
    throw new RangeError(`tensorsToFlat: out has ${out.length} floats, the layout needs ${total}`);
  const known = new Set(entries.map((e) => e.name));
  const extra = [...t.keys()].filter((k) => !known.has(k) && k !== "lm_head.weight");
  if (extra.length)
    throw new UserError(
      "M7",
      `weights hold tensors this Llama shape does not have: ${extra.slice(0, 5).join(", ")}${extra.length > 5 ? ", ..." : ""}; check the config (layers/hidden) matches the weights`,
    );
  for (const e of entries) {
    const s = t.get(e.name);
    if (!s)
      throw new UserError(
        "M7",
        `weights lack tensor "${e.name}" [${e.shape}]; the file is not a complete export of this model shape`,
      );
    if (s.shape.length !== e.shape.length || s.shape.some((d, i) => d !== e.shape[i])) {
      throw new UserError(
        "M7",
        `tensor "${e.name}" has shape [${s.shape}], the config needs [${e.shape}]; check the config matches the weights`,
      );
    }
    if (s.dtype !== "F32" && s.dtype !== "F64")
      throw new UserError("M7", `tensor "${e.name}" is ${s.dtype}; weights must be F32 (or F64, rounded)`);
    out.set(s.data as Float32Array | Float64Array, e.offset); // F64 -> F32 rounds to nearest
  }
}
