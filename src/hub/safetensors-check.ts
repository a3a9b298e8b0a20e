/**
 * A minimal structural check of a safetensors file (R4: "a download that is not real weights"):
 * 8-byte little-endian header length, a JSON header, and tensors whose byte ranges tile the data
 * section exactly and match dtype × shape. Reads only the header, never the tensors.
 */
import * as fsp from "node:fs/promises";

const DTYPE_BYTES: Record<string, number> = {
  F64: 8,
  F32: 4,
  F16: 2,
  BF16: 2,
  I64: 8,
  I32: 4,
  I16: 2,
  I8: 1,
  U64: 8,
  U32: 4,
  U16: 2,
  U8: 1,
  BOOL: 1,
  F8_E4M3: 1,
  F8_E5M2: 1,
};
const MAX_HEADER = 100 * 1024 * 1024;

export interface SafetensorsSummary {
  tensors: number;
  dataBytes: number;
  fileBytes: number;
}

/** Returns a summary, or throws an Error that says what is wrong with the file. */
export async function checkSafetensorsFile(file: string): Promise<SafetensorsSummary> {
  const fh = await fsp.open(file, "r");
  try {
    const size = (await fh.stat()).size;
    if (size < 8) throw new Error(`${file} is ${size} bytes: too short to hold a safetensors header`);
    const lenBuf = Buffer.alloc(8);
    await fh.read(lenBuf, 0, 8, 0);
    const n = lenBuf.readBigUInt64LE(0);
    if (n < 2n || n > BigInt(MAX_HEADER) || n > BigInt(size - 8))
      throw new Error(`${file}: header length ${n} does not fit in a ${size}-byte file`);
    const hdr = Buffer.alloc(Number(n));
    await fh.read(hdr, 0, hdr.length, 8);
    let json: Record<string, unknown>;
    try {
      json = JSON.parse(hdr.toString("utf8"));
    } catch {
      throw new Error(`${file}: the header is not valid JSON`);
    }
    if (!json || typeof json !== "object" || Array.isArray(json))
      throw new Error(`${file}: the header is not a JSON object`);
    const dataBytes = size - 8 - Number(n);
    const ranges: [number, number, string][] = [];
    for (const [name, v] of Object.entries(json)) {
      if (name === "__metadata__") continue;
      const t = v as { dtype?: unknown; shape?: unknown; data_offsets?: unknown };
      const per = DTYPE_BYTES[String(t?.dtype)];
      if (!per) throw new Error(`${file}: tensor ${name} has unknown dtype ${JSON.stringify(t?.dtype)}`);
      if (!Array.isArray(t.shape) || !t.shape.every((d) => Number.isSafeInteger(d) && d >= 0))
        throw new Error(`${file}: tensor ${name} has an invalid shape`);
      const off = t.data_offsets;
      if (
        !Array.isArray(off) ||
        off.length !== 2 ||
        !off.every((x) => Number.isSafeInteger(x) && x >= 0) ||
        off[1] < off[0]
      ) {
        throw new Error(`${file}: tensor ${name} has invalid data_offsets`);
      }
      const want = (t.shape as number[]).reduce((a, b) => a * b, 1) * per;
      if (off[1] - off[0] !== want)
        throw new Error(
          `${file}: tensor ${name} spans ${off[1] - off[0]} bytes but ${t.dtype}${JSON.stringify(t.shape)} needs ${want}`,
        );
      ranges.push([off[0], off[1], name]);
    }
    if (ranges.length === 0) throw new Error(`${file}: the header lists no tensors`);
    ranges.sort((a, b) => a[0] - b[0]);
    let at = 0;
    for (const [s, e, name] of ranges) {
      if (s !== at) throw new Error(`${file}: tensor ${name} starts at ${s}, expected ${at} (gap or overlap)`);
      at = e;
    }
    if (at !== dataBytes)
      throw new Error(
        `${file}: tensors cover ${at} bytes but the file holds ${dataBytes} bytes of data (truncated or padded)`,
      );
    return { tensors: ranges.length, dataBytes, fileBytes: size };
  } finally {
    await fh.close();
  }
}
