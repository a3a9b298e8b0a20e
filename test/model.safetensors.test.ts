/** safetensors encode/decode (M7, K2): bit-identical round trips, HF names, clear errors on corrupt files. */
import { test } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { UserError } from "../src/errors";
import { buildConfig, configFromHf } from "../src/model/llama-config";
import { initWeights } from "../src/model/init";
import { paramLayout } from "../src/model/layout";
import {
  decodeSafetensors,
  encodeSafetensors,
  flatToTensors,
  readSafetensors,
  tensorsToFlat,
  writeSafetensors,
  type StTensor,
} from "../src/model/safetensors";

const FIX = path.join(__dirname, "..", "..", "test", "fixtures", "llama-tiny");

function sample(): StTensor[] {
  const f32 = new Float32Array([1.5, -0, NaN, Infinity, -Infinity, 1e-45, 3.4028234663852886e38, Math.PI]);
  const f64 = new Float64Array([Math.E, -0, 5e-324, Number.MAX_VALUE, NaN, 1 / 3]);
  const i32 = new Int32Array([0, -1, 2147483647, -2147483648, 42, 7]);
  return [
    { name: "a.f32", dtype: "F32", shape: [2, 4], data: f32 },
    { name: "b.f64", dtype: "F64", shape: [3, 2], data: f64 },
    { name: "c.i32", dtype: "I32", shape: [6], data: i32 },
    { name: "d.i64", dtype: "I64", shape: [2], data: new BigInt64Array([-5n, 9007199254740993n]) },
    { name: "e.u8", dtype: "U8", shape: [3], data: new Uint8Array([0, 128, 255]) },
    { name: "f.empty", dtype: "F32", shape: [0, 3], data: new Float32Array(0) },
  ];
}

function bytesOf(t: StTensor): Buffer {
  return Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength);
}

test("F32, F64, I32 (and I64, U8) tensors round-trip bit-identically with their metadata (K2)", () => {
  const ts = sample();
  const buf = encodeSafetensors(ts, { format: "pt", step: "12" });
  assert.equal(Number(buf.readBigUInt64LE(0)) % 8, 0, "the data section starts 8-aligned");
  const { tensors, metadata } = decodeSafetensors(buf);
  assert.deepEqual(metadata, { format: "pt", step: "12" });
  assert.equal(tensors.size, ts.length);
  for (const t of ts) {
    const r = tensors.get(t.name)!;
    assert.equal(r.dtype, t.dtype);
    assert.deepEqual(r.shape, t.shape);
    assert.ok(bytesOf(r).equals(bytesOf(t)), `${t.name} bytes differ`);
  }
});

test("writeSafetensors writes through a .tmp file and readSafetensors reads it back (K2)", () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "st-"));
  try {
    const p = path.join(dir, "model.safetensors");
    writeSafetensors(p, sample());
    assert.ok(!fs.existsSync(`${p}.tmp`));
    const back = readSafetensors(p);
    assert.ok(bytesOf(back.tensors.get("b.f64")!).equals(bytesOf(sample()[1])));
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test("the fixture's PyTorch-written file decodes by HF names into the flat layout, and re-encodes byte-identically (M7)", () => {
  const cfg = configFromHf(JSON.parse(fs.readFileSync(path.join(FIX, "config.json"), "utf8")));
  const raw = fs.readFileSync(path.join(FIX, "model.safetensors"));
  const { tensors } = decodeSafetensors(raw);
  assert.ok(tensors.has("model.layers.1.self_attn.q_proj.weight"));
  const flat = new Float32Array(paramLayout(cfg).total);
  tensorsToFlat(cfg, tensors, flat);
  const again = new Float32Array(flat.length);
  tensorsToFlat(cfg, new Map(flatToTensors(cfg, flat).map((t) => [t.name, t])), again);
  assert.deepEqual(again, flat);
  // the reference writer sorts names; so must we, to reproduce its bytes
  const sorted = flatToTensors(cfg, flat).sort((a, b) => (a.name < b.name ? -1 : 1));
  assert.ok(encodeSafetensors(sorted).equals(raw), "same bytes as the PyTorch writer");
});

test("tensorsToFlat accepts F64 (rounded) and refuses missing, misshapen or unknown tensors, naming them (M7)", () => {
  const cfg = buildConfig({ seqLen: 16, layers: 1, hidden: 36, vocabSize: 32 });
  const flat = new Float32Array(paramLayout(cfg).total);
  initWeights(cfg, 1, flat);
  const ts = flatToTensors(cfg, flat);
  const m = new Map(ts.map((t) => [t.name, t]));
  const f64 = new Map(
    ts.map((t) => [t.name, { ...t, dtype: "F64" as const, data: Float64Array.from(t.data as Float32Array) }]),
  );
  const out = new Float32Array(flat.length);
  tensorsToFlat(cfg, f64, out);
  assert.deepEqual(out, flat);
  const missing = new Map(m);
  missing.delete("model.norm.weight");
  assert.throws(() => tensorsToFlat(cfg, missing, out), /lack tensor "model.norm.weight"/);
  const bad = new Map(m);
  bad.set("model.layers.0.mlp.up_proj.weight", { ...m.get("model.layers.0.mlp.up_proj.weight")!, shape: [36, 64] });
  assert.throws(
    () => tensorsToFlat(cfg, bad, out),
    /"model.layers.0.mlp.up_proj.weight" has shape \[36,64\], the config needs \[64,36\]/,
  );
  const extra = new Map(m);
  extra.set("model.layers.1.mlp.up_proj.weight", m.get("model.layers.0.mlp.up_proj.weight")!);
  assert.throws(() => tensorsToFlat(cfg, extra, out), /model.layers.1.mlp.up_proj.weight/);
  const tied = new Map(m);
  tied.set("lm_head.weight", m.get("model.embed_tokens.weight")!);
  tensorsToFlat(cfg, tied, out); // a tied head is tolerated
});

test("corrupt files give a clear UserError naming what is wrong (M7)", () => {
  const good = encodeSafetensors(sample());
  const check = (buf: Buffer, re: RegExp) =>
    assert.throws(
      () => decodeSafetensors(buf),
      (e: unknown) => {
        assert.ok(e instanceof UserError, String(e));
        assert.match(e.message, /not a valid safetensors file/);
        assert.match(e.message, re);
        return true;
      },
    );
  check(Buffer.alloc(5), /shorter than the 8-byte header/);
  const huge = Buffer.from(good);
  huge.writeBigUInt64LE(10n ** 12n, 0);
  check(huge, /header length 1000000000000 exceeds/);
  const garbled = Buffer.from(good);
  garbled.write("}}}}", 8);
  check(garbled, /JSON header does not parse/);
  check(good.subarray(0, good.length - 3), /past the data|cover/);
  const hlen = Number(good.readBigUInt64LE(0));
  const header = JSON.parse(good.toString("utf8", 8, 8 + hlen));
  const rebuild = (h: unknown, data: Buffer) => {
    let hb = Buffer.from(JSON.stringify(h));
    hb = Buffer.concat([hb, Buffer.alloc((8 - (hb.length % 8)) % 8, 0x20)]);
    const len = Buffer.alloc(8);
    len.writeBigUInt64LE(BigInt(hb.length));
    return Buffer.concat([len, hb, data]);
  };
  const data = good.subarray(8 + hlen);
  check(rebuild({ ...header, "a.f32": { ...header["a.f32"], dtype: "BF17" } }, data), /tensor "a.f32": dtype "BF17"/);
  check(
    rebuild({ ...header, "b.f64": { ...header["b.f64"], shape: [3, 3] } }, data),
    /tensor "b.f64": data_offsets .* needs 72/,
  );
  check(rebuild(header, Buffer.concat([data, Buffer.alloc(4)])), /trailing bytes/);
  const p = path.join(os.tmpdir(), `bad-${process.pid}.safetensors`);
  fs.writeFileSync(p, Buffer.alloc(3));
  try {
    assert.throws(() => readSafetensors(p), new RegExp(p.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")));
  } finally {
    fs.rmSync(p, { force: true });
  }
});
