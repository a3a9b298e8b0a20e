/**
 * The webgpu engine's shader settings by name (src/model/engine/webgpu/shaders/, engine.ts), on any machine: no
 * adapter is needed.
 *  - each shader's WGSL `struct P` is its declared settings, in order, and the shader reads each of them and no
 *    other (a misspelled or missing name in a declaration fails here, not as wrong numbers on a device);
 *  - packParams puts each setting at its declared place whatever the order of the object, and refuses a missing,
 *    misspelled or extra name and a u32 out of range;
 *  - every kernel of the engine, run on a recording device, dispatches its shader with exactly its settings and
 *    one operand per storage array; matmuls binds each distinct buffer once and splits along K with a reduce;
 *  - the fused attention makes no buffer of B*H*T*T floats at the frozen model's shape (no scratch at all), runs
 *    its backward in one dispatch, and refuses a head size over 128 before any work; each dispatch gives exactly
 *    the pipeline constants (WGSL overrides) its shader leaves open, and the attention shaders get one pipeline per
 *    head size, E their constant;
 *  - the frozen model's micro-batch (seq 1024 x 4) records at most the dispatches its test names, counted on a
 *    device that runs nothing (bench/webgpu-count.ts).
 *  - rmsnormBackward's deferred weight gradients: one rmsnormBackwardW for all pending calls, recorded before a
 *    kernel that binds a pending dw, before a second call on one dw, and at settle, never otherwise.
 * test/model.webgpu.test.ts runs the same kernels on an adapter against the JS reference.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { type DeferredKernels, isDeferred } from "../src/model/kernels";
import { webgpuEngineOn } from "../src/model/engine/webgpu/engine";
import type { GpuDevice } from "../src/model/engine/webgpu/device";
import { webgpuCounts } from "../bench/webgpu-count";
import { packParams, type Shader, shader, withWritable } from "../src/model/engine/webgpu/shaders/framework";
import { BK, TILE } from "../src/model/engine/webgpu/shaders/matmul";
import { rmsnormRows } from "../src/model/engine/webgpu/shaders/rows";
import { SHADERS, type ShaderName } from "../src/model/engine/webgpu/shaders/catalog";

const NAMES = Object.keys(SHADERS) as ShaderName[];

/** The fields of a WGSL `struct P { a: u32, b: f32 }`, in order, as [name, type]. */
function structFields(code: string): [string, string][] {
  const m = /struct P \{([^}]*)\}/.exec(code);
  assert.ok(m, "a struct P");
  return m[1]
    .split(",")
    .map((f) => f.trim())
    .filter((f) => f)
    .map((f) => f.split(/\s*:\s*/) as [string, string]);
}

test("each webgpu shader's struct P is its declared settings in order, and its WGSL reads each of them and no other", () => {
  for (const name of NAMES) {
    const s: Shader = SHADERS[name];
    assert.deepEqual(structFields(s.code), Object.entries(s.params), `${name}: struct P`);
    const read = new Set([...s.code.matchAll(/\bp\.([A-Za-z_]\w*)/g)].map((m) => m[1]));
    for (const n of read) assert.ok(Object.hasOwn(s.params, n), `${name} reads p.${n}, which it does not declare`);
    for (const n of Object.keys(s.params)) assert.ok(read.has(n), `${name} declares ${n} and never reads p.${n}`);
    const bindings = [...s.code.matchAll(/@binding\((\d+)\) var<storage, (read|read_write)> (\w+)/g)];
    assert.deepEqual(
      bindings.map((b) => [Number(b[1]), b[3], b[2]]),
      s.bindings.map((b, i) => [i, b.split(":")[0], s.access[i]]),
      `${name}: storage bindings, each with its declared access`,
    );
    // a binding declared read is only read: no assignment to it anywhere in the WGSL
    for (const [i, b] of s.bindings.entries()) {
      const n = b.split(":")[0];
      if (s.access[i] === "read")
        assert.doesNotMatch(s.code, new RegExp(`\\b${n}\\[[^\\]]*\\]\\s*=[^=]`), `${name} writes ${n}, declared read`);
    }
    assert.match(s.code, new RegExp(`@binding\\(${s.bindings.length}\\) var<uniform> p: P;`), `${name}: the uniform`);
  }
});

test("the matmul shaders' tile is TILE: 8 x 8 threads of 8 x 8 outputs, padded shared tiles of BK rows", () => {
  for (const name of ["matmul_nn", "matmul_nt", "matmul_tn", "matmul_tt", "matmuls"] as const) {
    const code = SHADERS[name].code;
    assert.match(code, /@workgroup_size\(8, 8\)/, name);
    assert.match(code, new RegExp(`var<workgroup> As: array<vec4<f32>, ${BK * (TILE / 4 + 1)}>;`), name);
    assert.match(code, new RegExp(`let m0 = \\(tile / jb\\.X\\) \\* ${TILE}u;`), name);
    assert.match(code, new RegExp(`kb \\+= ${BK}u`), name);
    // 16 vec4 FMAs a k: 8 x 8 outputs
    assert.equal((code.match(/ = c\d+ \+ a[01]\.[xyzw] \* b[01];/g) ?? []).length, 16, `${name}: 16 vec4 FMAs a k`);
  }
  // a pipeline per transpose pair: the pair is a constant there, and the uniform's in matmuls
  assert.match(SHADERS.matmul_tn.code, /let TA = 1u;\s+let TB = 0u;/);
  assert.match(SHADERS.matmuls.code, /let TA = tm\.tA;\s+let TB = tm\.tB;/);
});

test("packParams writes each setting by name at its declared place, and refuses a missing, misspelled or extra name", () => {
  const s = SHADERS.rope; // n, T, nh, h, oX, oC, oS (u32), sign (f32)
  const v = { sign: -1, oS: 7, oC: 6, oX: 5, h: 4, nh: 3, T: 2, n: 1 }; // the object's order is not the struct's
  const raw = packParams("rope", s, v);
  assert.equal(raw.byteLength, 32);
  assert.deepEqual([...new Uint32Array(raw).slice(0, 7)], [1, 2, 3, 4, 5, 6, 7]);
  assert.equal(new Float32Array(raw)[7], -1);
  const { oC: _, ...missing } = v;
  assert.throws(
    () => packParams("rope", s, missing),
    /^Error: webgpu: rope takes settings n, T, nh, h, oX, oC, oS, sign; missing oC$/,
  );
  assert.throws(() => packParams("rope", s, { ...missing, oc: 6 }), /; missing oC; unknown oc$/);
  assert.throws(() => packParams("rope", s, { ...v, scale: 1 }), /; unknown scale$/);
  assert.throws(() => packParams("rope", s, { ...v, oX: -1 }), /rope setting oX = -1 is no u32/);
  assert.throws(() => packParams("rope", s, { ...v, n: 1.5 }), /rope setting n = 1.5 is no u32/);
});

interface Dispatch {
  shader: ShaderName;
  operands: number;
  uniform: ArrayBuffer;
  /** its pipeline's constants (the shader's WGSL overrides), {} where none were given */
  constants: Record<string, number>;
  /** Each storage operand's buffer range. */
  ranges: { buffer: unknown; offset: number; size: number }[];
}

/** A device that records each dispatch (its shader, operand count and uniform bytes) and runs nothing. */
function recordingDevice(maxBinding = 1 << 30): {
  device: GpuDevice;
  dispatches: Dispatch[];
  created: number[];
  pipelines: { shader: ShaderName; constants: Record<string, number> }[];
  /** The WGSL of each shader module made, in order. */
  codes: string[];
} {
  const dispatches: Dispatch[] = [];
  const created: number[] = [];
  const pipelines: { shader: ShaderName; constants: Record<string, number> }[] = [];
  // a dispatch may run a variant whose read-only arrays are bound read_write (withWritable): found as its shader
  const plain = (code: string) => code.replaceAll("var<storage, read>", "var<storage, read_write>");
  const byCode = new Map(NAMES.map((n) => [plain(SHADERS[n].code), n]));
  const codes: string[] = [];
  const buffer = (size: number) => {
    const raw = new ArrayBuffer(size);
    return { size, raw, destroy() {}, getMappedRange: () => raw, unmap() {}, mapAsync: async () => {} };
  };
  type Buf = ReturnType<typeof buffer>;
  let pipeline: { shader: ShaderName; constants: Record<string, number> } | null = null;
  let group: { entries: { resource: { buffer: Buf; offset?: number; size?: number } }[] } | null = null;
  const pass = {
    setPipeline(p: unknown) {
      pipeline = p as typeof pipeline;
    },
    setBindGroup(_i: number, g: unknown) {
      group = g as typeof group;
    },
    dispatchWorkgroups() {
      assert.ok(pipeline && group);
      const entries = group.entries;
      const u = entries[entries.length - 1].resource;
      const uniform = u.buffer.raw.slice(u.offset ?? 0, (u.offset ?? 0) + (u.size ?? u.buffer.size));
      const ranges = entries.slice(0, -1).map(({ resource: r }) => ({
        buffer: r.buffer,
        offset: r.offset ?? 0,
        size: r.size ?? r.buffer.size,
      }));
      dispatches.push({
        shader: pipeline.shader,
        operands: entries.length - 1,
        uniform,
        constants: pipeline.constants,
        ranges,
      });
    },
    end() {},
  };
  const device: GpuDevice = {
    limits: {
      minStorageBufferOffsetAlignment: 256,
      minUniformBufferOffsetAlignment: 256,
      maxStorageBufferBindingSize: maxBinding,
    },
    queue: {
      submit() {},
      onSubmittedWorkDone: async () => {},
      writeBuffer(b, offset, data) {
        new Uint8Array((b as Buf).raw, offset).set(new Uint8Array(data.buffer, data.byteOffset, data.byteLength));
      },
    },
    lost: new Promise(() => {}),
    onuncapturederror: null,
    createBuffer: (d) => {
      created.push(d.size);
      return buffer(d.size);
    },
    createShaderModule: (d) => {
      codes.push(d.code);
      return { shader: byCode.get(plain(d.code)) };
    },
    createComputePipeline: (d) => {
      const made = {
        shader: (d.compute.module as { shader: ShaderName }).shader,
        constants: { ...d.compute.constants },
      };
      pipelines.push(made);
      return { ...made, getBindGroupLayout: () => null };
    },
    createBindGroup: (d) => d,
    createCommandEncoder: () => ({
      beginComputePass: () => pass,
      copyBufferToBuffer() {},
      clearBuffer() {},
      resolveQuerySet() {},
      finish: () => ({}),
    }),
    destroy() {},
  };
  return { device, dispatches, created, pipelines, codes };
}

/** Each setting of a recorded dispatch by name, read back as its declared type. */
function settingsOf(d: Dispatch): Record<string, number> {
  const u32 = new Uint32Array(d.uniform),
    f32 = new Float32Array(d.uniform);
  return Object.fromEntries(
    Object.entries(SHADERS[d.shader].params).map(([n, t], i) => [n, t === "f32" ? f32[i] : u32[i]]),
  );
}

/** Calls every kernel of `k` once on small arrays: views at offsets (matmul's A, B, C at 1, 2, 3 floats). */
function callEvery(k: DeferredKernels): void {
  const f = (n: number, at = 3) => new Float32Array(n + at).subarray(at);
  const [B, T, H, K, E, D, V] = [2, 3, 4, 2, 4, 8, 5];
  const ids = Int32Array.from({ length: B * T }, (_, i) => i % V);
  k.matmul(false, true, 3, 5, 7, 0.5, f(21, 1), f(35, 2), 0.25, f(15, 3));
  k.matmul(false, false, 3, 5, 7, 1, f(21), f(35), 0, f(15));
  k.matmul(true, false, 3, 5, 7, 1, f(21), f(35), 0, f(15));
  k.matmul(true, true, 3, 5, 2000, 1, f(6000), f(10000), 1, f(15)); // split along K: matmul_reduce
  assert.ok(k.matmuls, "the webgpu engine has matmuls");
  const t = { tA: false, tB: true, M: 3, N: 5, K: 7, alpha: 1 };
  const arena = new Float32Array(200), // one buffer, bound once: views into it
    v = (at: number, n: number) => arena.subarray(at, at + n);
  k.matmuls([
    { C: v(0, 15), beta: 0, terms: [{ ...t, A: v(100, 21), B: v(130, 35) }] },
    {
      C: v(20, 15),
      beta: 0,
      add: f(15),
      terms: [
        { ...t, A: v(100, 21), B: v(130, 35) },
        { ...t, tA: true, A: f(21), B: f(35) },
      ],
    },
  ]);
  k.embeddingForward(f(B * T * D), ids, f(V * D), B * T, D);
  k.embeddingBackward(f(V * D), ids, f(B * T * D), B * T, D);
  k.rmsnormForward(f(B * T * D), f(B * T), f(B * T * D), f(D), B * T, D, 1e-5);
  const dw = f(D);
  k.rmsnormBackward(f(B * T * D), dw, f(B * T * D), f(B * T * D), f(D), f(B * T), B * T, D);
  k.ropeForward(f(B * T * H * E), f(T * E), f(T * E), B, T, H, E);
  k.ropeBackward(f(B * T * H * E), f(T * E), f(T * E), B, T, H, E);
  const q = B * T * H * E,
    kv = B * T * K * E;
  assert.ok(k.ropeQK, "the webgpu engine has ropeQK");
  k.ropeQK(f(q), f(kv), f(T * E), f(T * E), B, T, H, K, E, true);
  k.attentionForward(f(q), f(B * H * T), f(q), f(kv), f(kv), B, T, H, K, E);
  k.attentionBackward(f(q), f(kv), f(kv), f(q), f(q), f(kv), f(kv), f(q), f(B * H * T), B, T, H, K, E);
  k.attentionCachedForward(f(T * H * E), f(T * H * E), f((2 + T) * K * E), f((2 + T) * K * E), 2, T, H, K, E);
  k.swigluForward(f(12), f(12), f(12), 12);
  k.swigluBackward(f(12), f(12), f(12), f(12), f(12), 12);
  k.crossEntropy(f(B * T * V), ids, B * T, V, 0.5);
  assert.ok(isDeferred(k), "the webgpu engine is deferred: it has copy and fill (kernels.ts: DeferredKernels)");
  k.copy(f(D), dw); // reads the pending dw: rmsnormBackward's deferred rmsnormBackwardW is recorded first
  k.copy(f(9), f(9));
  k.fill(f(9), 2.5);
  k.fold(new Float64Array(11).subarray(2), f(9), true);
}

test("a read-only storage array is bound read_write only in a dispatch that writes another range of its device buffer; every array declares its access", () => {
  const { device, codes } = recordingDevice();
  const k = webgpuEngineOn(device, "recording").kernels;
  assert.ok(isDeferred(k));
  const copyCode = (src: "read" | "read_write") =>
    codes.filter(
      (c) =>
        c.includes(`@binding(1) var<storage, ${src}> src: array<f32>;`) && c.includes("dst[p.oD + i] = src[p.oS + i];"),
    );
  k.copy(new Float32Array(9), new Float32Array(9)); // two buffers: src read-only
  assert.equal(copyCode("read").length, 1);
  assert.equal(copyCode("read_write").length, 0);
  const one = new Float32Array(256); // one buffer: src bound read_write (WebGPU refuses it bound both ways)
  k.copy(one.subarray(0, 9), one.subarray(64, 73));
  assert.equal(copyCode("read_write").length, 1);
  k.copy(one.subarray(128, 137), one.subarray(192, 201)); // the same variant again: no new pipeline
  assert.equal(codes.length, 2);
  assert.equal(withWritable(SHADERS.copy.code, []), SHADERS.copy.code);
  assert.throws(() => withWritable(SHADERS.copy.code, [0]), /no read-only storage binding 0 to make writable/);
  assert.throws(
    () => shader(["x"], { n: "u32" }, ""),
    /storage array x declares no access \("x:read" or "x:read_write"\)/,
  );
  assert.throws(() => shader(["x:rw"], { n: "u32" }, ""), /storage array x declares no access/);
  assert.match(
    shader(["x:read:i32", "y:read_write"], { n: "u32" }, "").code,
    /@binding\(0\) var<storage, read> x: array<i32>;\n@group\(0\) @binding\(1\) var<storage, read_write> y: array<f32>;/,
  );
});

test("every kernel of the webgpu engine dispatches its shader with exactly its settings, by name, and one operand per storage array", () => {
  const { device, dispatches } = recordingDevice();
  const k = webgpuEngineOn(device, "recording").kernels;
  assert.doesNotThrow(() => callEvery(k));
  assert.deepEqual(new Set(dispatches.map((d) => d.shader)), new Set(NAMES), "every shader dispatched");
  for (const d of dispatches) assert.equal(d.operands, SHADERS[d.shader].bindings.length, d.shader);
  // the settings read back by name are the call's: sizes, flags, scales, and the views' element offsets
  const mm = settingsOf(dispatches[0]);
  assert.equal(dispatches[0].shader, "matmul_nt");
  assert.deepEqual(
    { jobs: mm.jobs, M: mm.M0, N: mm.N0, K: mm.K0_0, alpha: mm.al0_0, beta: mm.be0_0, splits: mm.sp0 },
    { jobs: 1, M: 3, N: 5, K: 7, alpha: 0.5, beta: 0.25, splits: 1 },
  );
  // A, B and C: three buffers, bound once each, starting 1, 2 and 3 floats into their bindings
  assert.deepEqual([mm.bA0_0, mm.bB0_0, mm.bC0], [0, 1, 2]);
  assert.deepEqual([mm.oA0_0, mm.oB0_0, mm.oC0], [1, 2, 3]);
  const tt = dispatches.findIndex((d) => d.shader === "matmul_tt");
  assert.equal(dispatches[tt + 1].shader, "matmul_reduce", "a split product's partial sums are reduced next");
  assert.ok(settingsOf(dispatches[tt]).sp0 > 1, "K = 2000 on a 3 x 5 output is split");
  const many = settingsOf(dispatches.find((d) => d.shader === "matmuls")!);
  assert.deepEqual(
    [many.jobs, many.nt0, many.nt1, many.ad1, many.tA1_1, many.tB1_1, many.be1_0, many.be1_1, many.oC1, many.oA1_0],
    [2, 1, 2, 1, 1, 1, 1, 1, 20, 100],
    "two jobs, the second with add and two terms (beta 1 after the first)",
  );
  const rope = dispatches.filter((d) => d.shader === "rope").map(settingsOf);
  assert.deepEqual(
    rope.map((r) => r.sign),
    [1, -1],
  );
  const qk = dispatches.filter((d) => d.shader === "ropeQK").map(settingsOf);
  assert.deepEqual(
    qk.map((r) => [r.nq, r.nk, r.H, r.K, r.h, r.sign]),
    [[2 * 3 * 4 * 2, 2 * 3 * 2 * 2, 4, 2, 2, -1]],
  );
  const at = dispatches.findIndex((d) => d.shader === "rmsnormBackwardW");
  assert.equal(dispatches[at + 1].shader, "copy", "the deferred dw sum comes right before the copy that reads dw");
  const fill = settingsOf(dispatches[dispatches.length - 2]);
  assert.deepEqual([fill.n, fill.value], [9, 2.5]);
  const fold = settingsOf(dispatches[dispatches.length - 1]);
  assert.deepEqual(
    [fold.n, fold.oG, fold.oS, fold.sets],
    [9, 3, 2, 1],
    "the fold: 9 elements, set, at offsets 3 and 2",
  );
  const att = dispatches.find((d) => d.shader === "attentionForward");
  assert.ok(att);
  assert.equal(settingsOf(att).scale, Math.fround(1 / Math.sqrt(4)));
  // pipeline constants: each dispatch gives exactly the overrides its shader leaves without a value; attention's
  // head size is one (one pipeline per head size), and n4, the setting its rolled row loops run to, matches it
  for (const d of dispatches) {
    const needed = [...SHADERS[d.shader].code.matchAll(/^override (\w+): \w+;$/gm)].map((m) => m[1]);
    assert.deepEqual(Object.keys(d.constants).sort(), needed.sort(), `${d.shader}: pipeline constants`);
  }
  for (const name of ["attentionForward", "attentionBackward", "attentionCachedForward"] as const) {
    const a = dispatches.filter((d) => d.shader === name);
    assert.equal(a.length, 1, name);
    assert.deepEqual(a[0].constants, { E: 4 }, `${name}: the head size is a pipeline constant`);
    assert.equal(settingsOf(a[0]).n4, 1, `${name}: n4 = ceil(E / 4)`);
  }
});

test("a webgpu dispatch with a setting missing, misspelled or extra, or an operand short, throws naming it and records nothing", () => {
  const { device, dispatches } = recordingDevice();
  const buffer = device.createBuffer({ size: 64, usage: 0 });
  const op = { buffer, offset: 0, size: 64, elem: 0 };
  // reached with a cast: the types refuse these settings at compile time, the dispatch refuses them at run time
  const dispatch = webgpuEngineOn(device, "recording").dispatch as unknown as (
    name: ShaderName,
    ops: (typeof op)[],
    params: Record<string, number>,
    grid: [number, number],
  ) => void;
  dispatch("fill", [op], { n: 16, oD: 0, value: 1 }, [1, 1]);
  assert.equal(dispatches.length, 1);
  assert.deepEqual(settingsOf(dispatches[0]), { n: 16, oD: 0, value: 1 });
  assert.throws(
    () => dispatch("fill", [op], { n: 16, oD: 0 }, [1, 1]),
    /^Error: webgpu: fill takes settings n, oD, value; missing value$/,
  );
  assert.throws(() => dispatch("fill", [op], { n: 16, od: 0, value: 1 }, [1, 1]), /; missing oD; unknown od$/);
  assert.throws(() => dispatch("fill", [op], { n: 16, oD: 0, value: 1, sign: 1 }, [1, 1]), /; unknown sign$/);
  assert.throws(() => dispatch("fill", [op], { n: 0, oD: 0 }, [0, 0]), /missing value/, "an empty grid is checked too");
  assert.throws(
    () => dispatch("fill", [], { n: 16, oD: 0, value: 1 }, [1, 1]),
    /^Error: webgpu: fill binds dst; given 0 operands$/,
  );
  assert.equal(dispatches.length, 1, "nothing more was recorded");
});

test("rmsnormBackward's weight gradients wait for one rmsnormBackwardW for all of them: before a kernel that binds a pending dw, a second call on one dw, or settle", async () => {
  const { device, dispatches } = recordingDevice();
  const k = webgpuEngineOn(device, "recording").kernels;
  const f = (n: number, at = 3) => new Float32Array(n + at).subarray(at);
  const [N, D] = [1030, 8]; // rows of 3: 344 blocks
  const grads = new Float32Array(4 * D + 64),
    dws = [0, 1, 2].map((i) => grads.subarray(i * D, (i + 1) * D)),
    other = grads.subarray(3 * D + 64, 4 * D + 64);
  const norm = (dw: Float32Array) => k.rmsnormBackward(f(N * D), dw, f(N * D), f(N * D), f(D), f(N), N, D);
  const names = () => dispatches.splice(0).map((d) => d.shader);
  // a first round grows the engine's partials buffer (a growth flushes what is pending); the second is the steady state
  for (const dw of dws) norm(dw);
  await k.settle([grads]);
  names();
  for (const dw of dws) norm(dw);
  k.fill(other, 0); // another part of the gradient buffer: no flush (and a clear: no dispatch)
  k.fill(other, 1);
  assert.deepEqual(names(), ["rmsnormBackward", "rmsnormBackward", "rmsnormBackward", "fill"]);
  norm(dws[0]); // dws[0] again: the three pending sums first, in one dispatch
  const flushed = dispatches[0];
  assert.deepEqual(names(), ["rmsnormBackwardW", "rmsnormBackward"]);
  assert.equal(settingsOf(flushed).S, 3, "one dispatch for the three pending sets");
  k.fill(dws[0], 0); // clears the pending dws[0]: its sum first
  assert.deepEqual(names(), ["rmsnormBackwardW"]);
  norm(dws[1]);
  await k.settle([grads]);
  assert.deepEqual(names(), ["rmsnormBackward", "rmsnormBackwardW"], "settle records the pending sum first");
  assert.equal(Math.ceil(N / rmsnormRows(N)), 344, "the row block");
});

test("the fused attention allocates no buffer of B*H*T*T floats at the frozen model's shape, and refuses a head size over 128", () => {
  const { device, created, dispatches } = recordingDevice();
  const k = webgpuEngineOn(device, "recording").kernels;
  const [B, T, H, K, E] = [4, 1024, 9, 3, 64];
  const f = (n: number) => new Float32Array(n);
  const q = B * T * H * E,
    kv = B * T * K * E;
  k.attentionForward(f(q), f(B * H * T), f(q), f(kv), f(kv), B, T, H, K, E);
  k.attentionBackward(f(q), f(kv), f(kv), f(q), f(q), f(kv), f(kv), f(q), f(B * H * T), B, T, H, K, E);
  k.attentionCachedForward(f(T * H * E), f(T * H * E), f(T * K * E), f(T * K * E), 0, T, H, K, E);
  assert.deepEqual(
    dispatches.map((d) => d.shader),
    ["attentionForward", "attentionBackward", "attentionCachedForward"],
    "one dispatch each: the backward's dq, dk and dv in one",
  );
  assert.ok(created.length > 0);
  assert.ok(Math.max(...created) < B * H * T * T * 4, `largest buffer ${Math.max(...created)} bytes`);
  assert.ok(Math.max(...created) <= q * 4, "nothing larger than an operand");
  const before = dispatches.length;
  assert.throws(
    () => k.attentionForward(f(8 * 129), f(1), f(8 * 129), f(129), f(129), 1, 1, 8, 1, 129),
    /^Error: webgpu: attention takes a head size of at most 128 \(its tiles in workgroup memory are sized for it\); this model's is 129; use --backend native$/,
  );
  assert.equal(dispatches.length, before, "refused before any dispatch");
});

test("the fused attention runs one pipeline per head size, the head size its pipeline constant E, with n4 = ceil(E / 4)", () => {
  const { device, dispatches, pipelines } = recordingDevice();
  const k = webgpuEngineOn(device, "recording").kernels;
  const f = (n: number) => new Float32Array(n);
  const call = (E: number) => {
    const [B, T, H, K] = [1, 5, 2, 1];
    k.attentionForward(
      f(B * T * H * E),
      f(B * H * T),
      f(B * T * H * E),
      f(B * T * K * E),
      f(B * T * K * E),
      B,
      T,
      H,
      K,
      E,
    );
  };
  for (const E of [64, 6, 64, 6, 128]) call(E);
  assert.deepEqual(
    pipelines.filter((p) => p.shader === "attentionForward").map((p) => p.constants),
    [{ E: 64 }, { E: 6 }, { E: 128 }],
    "a pipeline made per head size, once",
  );
  assert.deepEqual(
    dispatches.map((d) => [d.constants.E, settingsOf(d).n4]),
    [
      [64, 16],
      [6, 2],
      [64, 16],
      [6, 2],
      [128, 32],
    ],
  );
});

test("the frozen model's micro-batch at seq 1024 x 4 records at most 450 dispatches with its fold on the device (894 before the matmuls lists, the column sums and the device-sized head chunks), the fold two of them", async () => {
  const c = await webgpuCounts(1024, 4, 1);
  assert.equal(c.fold, "device");
  assert.ok(c.dispatches_per_micro <= 450, `${c.dispatches_per_micro} dispatches per micro-batch`);
  const host = await webgpuCounts(1024, 4, 1, undefined, "host");
  assert.equal(
    c.dispatches_per_micro - host.dispatches_per_micro,
    2,
    "106M parameters fold in 2 dispatches at 128 MiB",
  );
});

const f32 = (n: number) => new Float32Array(n);

test("the fold on the device runs in dispatches of 4C elements (C: the slot elements a binding holds) through two gradient and four slot bindings, none aliased; fill(x, 0) is a clear, no dispatch", () => {
  const { device, dispatches } = recordingDevice(4096 + 256); // C = 512: 2048 elements a dispatch
  const k = webgpuEngineOn(device, "recording").kernels;
  const n = 5000;
  const g = new Float32Array(n + 3).subarray(3),
    slot = new Float64Array(n + 2).subarray(2);
  assert.ok(isDeferred(k));
  k.fill(g, 0);
  assert.equal(dispatches.length, 0, "fill(x, 0) records no dispatch");
  k.fold(slot, g, true);
  k.fold(slot, g, false);
  assert.deepEqual(
    dispatches.map((d) => d.shader),
    Array(6).fill("foldMicro"),
  );
  // g starts 12 bytes, the slot 16 bytes past an aligned offset: each dispatch takes 4C elements less its offset
  const each = [
    [2045, 512, 3, 2],
    [2017, 512, 0, 31],
    [938, 512, 33, 0],
  ];
  assert.deepEqual(
    dispatches.map(settingsOf).map((x) => [x.n, x.C, x.oG, x.oS, x.sets]),
    [1, 0].flatMap((sets) => each.map((e) => [...e, sets])),
  );
  const ranges = dispatches[2].ranges; // 938 elements from float 33 and double 0: g0, s0 and s1 real, the rest spare
  assert.deepEqual(
    ranges.map((r) => r.size),
    [4 * (33 + 938), 256, 8 * 512, 8 * (938 - 512), 256, 256],
  );
  for (const d of dispatches)
    for (const [i, a] of d.ranges.entries())
      for (const [j, b] of d.ranges.entries())
        if (i < j && a.buffer === b.buffer)
          assert.ok(a.offset + a.size <= b.offset || b.offset + b.size <= a.offset, `bindings ${i} and ${j} overlap`);
  assert.throws(() => k.fold(new Float64Array(4), f32(5), true), /fold: a float64 slot of 4 for a gradient of 5/);
});
