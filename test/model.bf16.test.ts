/**
 * P8: the model with bf16 matrix products (`--precision bf16`) on the native engine: one step of llama-tiny
 * against a float64 reference that rounds to bf16 at the same points (test/helpers/bf16-reference.ts), and every
 * bf16 kernel (the AMX-BF16 one where the CPU has it, the emulations on the fp32 AVX-512, AVX2 and portable
 * kernels) giving the same bits. The fp32 path's own parity is model.parity.test.ts's.
 */
import { test, type TestContext } from "node:test";
import assert from "node:assert/strict";
import * as path from "node:path";
import { Llama } from "../src/model/llama";
import { bf16Support, loadNative, supportedIsas, type IsaChoice } from "../src/model/engine/native";
import { readSafetensors } from "../src/model/safetensors";
import type { Kernels } from "../src/model/kernels";
import { bf16ReferenceKernels } from "./helpers/bf16-reference";
import { FIX, loadTinyFixture } from "./helpers/fixture";
import { relErr, sameBits } from "./helpers/numeric";

const { cfg, ref, B, T, ids, layout, weights } = loadTinyFixture();
const refGrads = readSafetensors(path.join(FIX, "grads.f64.safetensors")).tensors;

/** The native kernels with bf16 products on `isa`, or null after marking the test skipped (a failure under
 *  TSTRAIN_REQUIRE_NATIVE=1). */
function bf16Kernels(t: TestContext, isa: IsaChoice = "auto"): Kernels | null {
  const n = loadNative({ gemm: "builtin", isa, precision: "bf16" });
  if ("kernels" in n) return n.kernels;
  if (process.env.TSTRAIN_REQUIRE_NATIVE === "1") throw new Error(`TSTRAIN_REQUIRE_NATIVE=1 but ${n.reason}`);
  t.skip(`native engine unavailable here: ${n.reason}`);
  return null;
}

function step(k: Kernels, gradCkpt: boolean): { loss: number; grads: Float32Array } {
  const m = new Llama(cfg, k, { gradCkpt });
  m.bindParams(weights);
  const grads = new Float32Array(layout.total);
  const loss = m.lossAndGrads(ids, B, T, 1, grads);
  m.dispose();
  return { loss, grads };
}

const reference = step(bf16ReferenceKernels(), true);
/** Tighter than the 1e-5 (loss) and 1e-3 (gradients): the engine and the reference differ only in how they
 *  sum, and the fp32 path must fall outside (the next test). */
const LOSS_TOL = 1e-7,
  GRAD_TOL = 1e-4;

test("one bf16 step of llama-tiny matches the float64 reference with bf16 rounding at the same points: loss 1e-7, every gradient 1e-4 (P8)", (t) => {
  const k = bf16Kernels(t);
  if (!k) return;
  assert.match(k.name, /bf16 products/);
  for (const gradCkpt of [false, true]) {
    const got = step(k, gradCkpt);
    const le = Math.abs(got.loss - reference.loss) / reference.loss;
    assert.ok(le < LOSS_TOL, `gradCkpt=${gradCkpt}: loss ${got.loss} vs the reference's ${reference.loss} (rel ${le})`);
    let worst = 0,
      at = "";
    for (const en of layout.entries) {
      const err = relErr(
        got.grads.subarray(en.offset, en.offset + en.size),
        reference.grads.subarray(en.offset, en.offset + en.size),
      );
      assert.ok(err < GRAD_TOL, `gradCkpt=${gradCkpt}, ${en.name}: gradient rel err ${err} against the bf16 reference`);
      if (err > worst) [worst, at] = [err, en.name];
    }
    console.log(
      `# BF16 gradCkpt=${gradCkpt}: loss rel err ${le.toExponential(2)}, worst gradient ${worst.toExponential(2)} (${at})`,
    );
  }
});

test("the bf16 reference is a bf16 computation: it stands apart from the fp32 float64 reference by more than the bf16 test's tolerances (P8)", () => {
  // were the products not rounded, the engine and the reference would both sit within 1e-4 of the fp32 reference
  const lossGap = Math.abs(reference.loss - ref.loss) / ref.loss;
  let worst = 0;
  for (const en of layout.entries)
    worst = Math.max(
      worst,
      relErr(reference.grads.subarray(en.offset, en.offset + en.size), refGrads.get(en.name)!.data as Float64Array),
    );
  console.log(`# BF16 vs fp32 reference: loss ${lossGap.toExponential(2)}, worst gradient ${worst.toExponential(2)}`);
  assert.ok(lossGap > 10 * LOSS_TOL, `loss gap ${lossGap}`);
  assert.ok(worst > 10 * GRAD_TOL, `worst gradient gap ${worst}`);
});

test("every bf16 kernel (AMX and VDPBF16PS where present, and the emulations on AVX-512, AVX2 and portable) gives the same loss and gradients, bit for bit (P8)", (t) => {
  const base = bf16Kernels(t);
  if (!base) return;
  const g = bf16Support();
  const isas: IsaChoice[] = [
    ...(g?.hw ? (["amx"] as const) : []),
    ...(g?.dp ? (["avx512bf16"] as const) : []),
    ...supportedIsas(),
  ];
  assert.ok(isas.includes("portable"), "the portable kernel is always there");
  const want = step(base, true);
  for (const isa of isas) {
    const k = bf16Kernels(t, isa)!;
    assert.match(k.name, new RegExp(`built-in ${isa}, .*bf16`), `--isa ${isa} loaded that kernel`);
    for (const gradCkpt of [true, false]) {
      const got = step(k, gradCkpt);
      assert.equal(got.loss, want.loss, `--isa ${isa} gradCkpt=${gradCkpt}: loss`);
      assert.ok(sameBits(got.grads, want.grads), `--isa ${isa} gradCkpt=${gradCkpt}: gradients differ in bits`);
    }
  }
  console.log(`# BF16 kernels compared: ${isas.join(", ")}`);
});

test("the fp32 products are untouched by a bf16 engine in the same thread: loading both switches the GEMM per call (P8)", (t) => {
  const k = bf16Kernels(t);
  if (!k) return;
  const fp = loadNative({ gemm: "builtin", isa: "auto", precision: "fp32" });
  assert.ok("kernels" in fp);
  const a = step(fp.kernels, true);
  step(k, true);
  const b = step(fp.kernels, true);
  assert.equal(a.loss, b.loss);
  assert.ok(sameBits(a.grads, b.grads), "fp32 gradients after a bf16 pass in the same thread");
  assert.ok(Math.abs(a.loss - ref.loss) / ref.loss < 1e-5, "and they are the fp32 path's (M4)");
  assert.notEqual(a.loss, step(k, true).loss, "the bf16 engine's loss is its own");
});

test("the packed weight copies of the AMX kernel give the bits of packing every time, and an update is seen after weightsChanged or a new registration (P8)", (t) => {
  const k = bf16Kernels(t);
  if (!k) return;
  const { weightsAre, weightsChanged } = k;
  assert.ok(weightsAre && weightsChanged, "the bf16 engine takes the weights' range");
  const shared = new Float32Array(new SharedArrayBuffer(weights.byteLength));
  shared.set(weights);
  const w2 = Float32Array.from(weights, (x, i) => x * (1 + 0.01 * Math.sin(i)));
  const run = (p: Float32Array) => {
    const m = new Llama(cfg, k, { gradCkpt: true });
    m.bindParams(p);
    const g = new Float32Array(layout.total);
    const loss = m.lossAndGrads(ids, B, T, 1, g);
    m.dispose();
    return { loss, g };
  };
  const plain1 = run(shared),
    plain2 = run(w2); // no range registered: every product packs its operands
  try {
    weightsAre(shared);
    const first = run(shared), // packs and keeps the weights' copies
      again = run(shared); // uses them
    assert.ok(sameBits(first.g, plain1.g) && first.loss === plain1.loss, "the first pass: the plain bits");
    assert.ok(sameBits(again.g, plain1.g) && again.loss === plain1.loss, "from the kept copies: the plain bits");
    shared.set(w2); // the optimizer's update, in place
    if (/built-in amx,/.test(k.name)) {
      // the norms and the embedding lookup read the new weights; the products' kept copies are the old ones
      const stale = run(shared);
      assert.ok(!sameBits(stale.g, plain2.g), "without weightsChanged the kept copies are used (the cache is live)");
    }
    weightsChanged();
    const after = run(shared);
    assert.ok(sameBits(after.g, plain2.g) && after.loss === plain2.loss, "after weightsChanged: the new weights' bits");
    // a second run in the same process whose weights lie where the first one's did: registering them makes the
    // copies stale, though the range is the same
    run(shared); // copies of w2 kept
    shared.set(weights);
    weightsAre(shared);
    const again2 = run(shared);
    assert.ok(sameBits(again2.g, plain1.g) && again2.loss === plain1.loss, "registered again: the new contents' bits");
  } finally {
    weightsAre(new Float32Array(0));
  }
});
