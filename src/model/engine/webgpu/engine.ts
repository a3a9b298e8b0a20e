/**
 * The webgpu engine (`--backend webgpu`): every kernel of the Kernels interface (model/kernels.ts), forward and
 * backward, as a WGSL compute shader on a WebGPU device; a deferred engine (DeferredKernels). This file ties its
 * rooms together and implements the kernels. The rooms, lowest first:
 *   gpus.ts          the host's GPUs, listed once in a stable order, and how a rank's is chosen (--gpus, A13)
 *   device.ts        Dawn, the adapter and its facts, the device opened (the one place, Dawn's toggles), the probe,
 *                    the advice
 *   recorder.ts      the command stream: pipelines (made in one place), uniform slab, bind groups, dispatch,
 *                    staging buffers, the device's errors, profile mode
 *   arena.ts         the host arrays' device mirrors: uploads, the loss rows, settle (the one readback)
 *   matmul-plan.ts   DeferredKernels.matmuls planned into dispatches: job groups, bindings, split-K
 *   shaders/         the WGSL: shaders/framework.ts (a shader from its bindings and settings, packParams), then one
 *                    file per family, shaders/matmul.ts, shaders/rows.ts, shaders/attention.ts, shaders/fold.ts
 *                    (the micro-batch fold, binary64 on u32 pairs), and every shader by name in shaders/catalog.ts
 *
 * Deferred. A kernel call only records its dispatch (and any upload, as a copy in the same command stream, so
 * the order holds); the whole forward+backward of a micro-batch is queued and submitted in batches, then its fold
 * into the rank's float64 slot (fold: shaders/fold.ts, binary64 on u32 pairs, foldMicro's bits) and
 * endMicroBatch(), and the rank awaits one settle() a step: the slot, read back once, and each micro-batch's loss
 * (each cross-entropy row's loss, written on the device and summed in float64 in row order). crossEntropy returns 0.
 * (With --webgpu-fold host, a settle per micro-batch reads the gradient back instead, for the host's foldMicro.)
 * rmsnormBackward defers its dw further: each call writes per-block partial column sums, and one rmsnormBackwardW
 * dispatch adds every pending call's sums into its dw, recorded before the next dispatch that binds a pending dw, a
 * second call on one dw, or settle (a micro-batch's 2L+1 norms: one dispatch where one binding spans their dws).
 * embeddingBackward takes per-token occurrence lists built here from the host's token ids (uploaded as an input).
 *
 * Deterministic: the shaders use no atomics and sum in fixed orders, the dispatches are the same for the same
 * calls, so a run on one device model is bit-identical run to run and resumes exactly.
 *
 * Attention is fused (shaders/attention.ts: FlashAttention-2's scheme): the forward and the cached forward one
 * dispatch each, the backward one dispatch for dq, dk and dv; the engine allocates nothing for it but the operands'
 * mirrors (no scores, no scratch), and refuses a head size over the shaders' ATT_EMAX.
 */
import type { DeferredKernels } from "../../kernels";
import { type GpuBuffer, type GpuDevice, openWebgpuDevice, USAGE, type WebgpuUnavailable } from "./device";
import type { GpuSelect } from "./gpus";
import { Arena, type HostArray, type Mirror } from "./arena";
import { type Bound, grid, MAX_GROUPS, type PipelineConstants, Recorder, type RecorderOptions } from "./recorder";
import { MatmulPlan, type SplitK } from "./matmul-plan";
import { WG } from "./shaders/framework";
import { rmsnormRows } from "./shaders/rows";
import { ATT_BQ, ATT_EMAX } from "./shaders/attention";
import { foldChunk } from "./shaders/fold";
import type { ParamsOf, ShaderName } from "./shaders/catalog";

/**
 * The engine's options: profile mode (every dispatch timed), and three for tests (a planted shader, split-K forced, a
 * binding limit below the device's).
 */
export interface EngineOptions extends RecorderOptions {
  splitK?: SplitK;
  maxBinding?: number;
}

/** Refuses a head size past what the fused attention's tiles in workgroup memory hold (shaders/attention.ts ATT_EMAX). */
function attentionFits(E: number): void {
  if (E > ATT_EMAX)
    throw new Error(
      `webgpu: attention takes a head size of at most ${ATT_EMAX} (its tiles in workgroup memory are sized for it); this model's is ${E}; use --backend native`,
    );
}

class WebgpuEngine {
  private readonly rec: Recorder;
  private readonly arena: Arena;
  private readonly mm: MatmulPlan;
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
  /** embeddingBackward's occurrence lists (CSR), a host array bound as an input: a fresh range per call within an epoch. */
  private csr = new Int32Array(0);
  private csrAt = 0;
  private csrEpoch = -1;
  /** A 256-byte range per fold binding, bound where the dispatch has no slot or gradient range left (never aliased). */
  private spare: GpuBuffer | null = null;

  constructor(
    private readonly device: GpuDevice,
    readonly name: string,
    opts: EngineOptions = {},
  ) {
    // a kernel that binds a pending dw sees it complete
    this.rec = new Recorder(device, opts, (shader, ops) => {
      if (shader !== "rmsnormBackwardW") this.flushFor(ops);
    });
    this.arena = new Arena(device, this.rec, opts.maxBinding);
    this.mm = new MatmulPlan(device, this.arena, this.rec, opts.splitK ?? "auto");
  }

  // ---------------------------------------------------------------- rmsnormBackward's deferred weight gradients

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
    const part = this.arena.own(this.part!, this.part!.size / 4);
    this.partAt = 0;
    const abs = (b: Bound) => b.offset + 4 * b.elem;
    const groups: { lo: number; hi: number; sets: typeof sets }[] = [];
    for (const st of sets) {
      const a = abs(st.dw),
        end = a + 4 * st.D;
      const g = groups.find((x) => {
        if (x.sets[0].dw.buffer !== st.dw.buffer) return false;
        const lo = Math.floor(Math.min(x.lo, a) / this.arena.align) * this.arena.align;
        return Math.max(x.hi, end) - lo <= this.arena.maxBinding;
      });
      if (g) {
        g.lo = Math.min(g.lo, a);
        g.hi = Math.max(g.hi, end);
        g.sets.push(st);
      } else groups.push({ lo: a, hi: end, sets: [st] });
    }
    for (const g of groups) {
      const lo = Math.floor(g.lo / this.arena.align) * this.arena.align;
      const dw: Bound = { buffer: g.sets[0].dw.buffer, offset: lo, size: Math.max(4, g.hi - lo), elem: 0 };
      const words = g.sets.flatMap((st) => [(abs(st.dw) - lo) / 4, st.pOff, st.nb, st.D]);
      const oT = this.table(words);
      const maxD = Math.max(...g.sets.map((st) => st.D));
      this.rec.dispatch(
        "rmsnormBackwardW",
        [dw, part, this.arena.own(this.tables!, this.tablesAt)],
        { S: g.sets.length, oT },
        [Math.ceil(maxD / WG), g.sets.length],
      );
    }
  }

  /** The element of `words` in the set-table buffer: written once (a new range, read by no command yet), then kept. */
  private table(words: number[]): number {
    const key = words.join(",");
    const found = this.tableAt.get(key);
    if (found !== undefined && this.tables) return found;
    const cap = this.tables ? this.tables.size / 4 : 0;
    if (!this.tables || this.tablesAt + words.length > cap) {
      if (this.tables) this.rec.retire(this.tables); // destroyed once the commands that use it are submitted
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
      if (floats > cap) this.arena.bindable(4 * floats);
      if (floats > cap || this.part === null || 2 * want <= Math.floor(this.arena.maxBinding / 4)) {
        if (this.part) this.rec.retire(this.part); // destroyed once the commands that use it are submitted
        this.part = this.device.createBuffer({
          size: 4 * Math.max(floats, Math.min(Math.floor(this.arena.maxBinding / 4), 2 * want)),
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
   * array per call within the arena's epoch (an input is uploaded once per settle or endMicroBatch: arena.ts cut).
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
    if (this.csrEpoch !== this.arena.epoch) {
      this.csrEpoch = this.arena.epoch;
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
    return { csr: this.arena.bind(c, "r"), U };
  }

  // ---------------------------------------------------------------- the micro-batch fold (A10)

  /**
   * DeferredKernels.fold: slot[0..n) = g (first) or slot + g in binary64, and g = 0 (shaders/fold.ts), n = g.length.
   * Each dispatch folds up to 4C elements (C: the slot elements one binding holds, 8C bytes): the gradient through
   * two bindings, the slot through four, each binding the next 8C bytes of its buffer from the aligned offset at or
   * below the dispatch's first element (so none overlaps another); a binding with nothing left takes a spare range.
   */
  private fold(slot: Float64Array, g: Float32Array, first: boolean): void {
    const n = g.length;
    if (slot.length < n) throw new RangeError(`fold: a float64 slot of ${slot.length} for a gradient of ${n}`);
    if (n === 0) return;
    const s = slot.length === n ? slot : slot.subarray(0, n);
    const sm = this.arena.claim(s, first ? "w" : "rw"), // the first fold writes all of it: nothing goes up
      gm = this.arena.claim(g, "rw");
    const C = foldChunk(this.arena.maxBinding),
      align = this.arena.align;
    this.spare ??= this.device.createBuffer({ size: 256 * 6, usage: USAGE.STORAGE });
    const spare = (binding: number): Bound => ({ buffer: this.spare!, offset: 256 * binding, size: 256, elem: 0 });
    // `count` bindings of `span` bytes each from the aligned offset below byte `at` of `m`, covering `bytes` bytes
    const bindings = (m: Mirror, at: number, bytes: number, count: number, spareAt: number): Bound[] =>
      Array.from({ length: count }, (_, k) => {
        const base = Math.floor(at / align) * align,
          lo = base + 8 * C * k,
          hi = Math.min(at + bytes, base + 8 * C * (k + 1));
        return lo < hi ? this.arena.own(m.gpu, (hi - lo) / 4, lo) : spare(spareAt + k);
      });
    for (let a = 0; a < n; ) {
      const gAt = g.byteOffset - gm.start + 4 * a,
        sAt = s.byteOffset - sm.start + 8 * a;
      const oG = (gAt % align) / 4,
        oS = (sAt % align) / 8;
      const count = Math.min(n - a, 4 * C - Math.max(oG, oS));
      const ops = [...bindings(gm, gAt, 4 * count, 2, 0), ...bindings(sm, sAt, 8 * count, 4, 2)];
      this.rec.dispatch("foldMicro", ops, { n: count, C, oG, oS, sets: first ? 1 : 0 }, grid(count));
      a += count;
    }
  }

  // ---------------------------------------------------------------- the Kernels

  kernels(): DeferredKernels {
    const arena = this.arena;
    const bindR = (a: HostArray) => arena.bind(a, "r");
    const d = <N extends ShaderName>(
      name: N,
      ops: Bound[],
      params: ParamsOf<N>,
      g: [number, number],
      constants?: PipelineConstants,
    ) => this.rec.dispatch(name, ops, params, g, constants);
    const e = (b: Bound) => b.elem;
    const k: DeferredKernels = {
      name: this.name,
      deferred: true,
      matmul: (tA, tB, M, N, K, alpha, A, B, beta, C) =>
        this.mm.run([{ C, beta, terms: [{ tA, tB, M, N, K, alpha, A, B }] }]),
      matmuls: (jobs) => this.mm.run(jobs),
      embeddingForward: (out, ids, E, N, D) => {
        const i = bindR(ids),
          t = bindR(E),
          o = arena.bind(out, "w");
        d("embeddingForward", [o, i, t], { n: N * D, D, oO: e(o), oI: e(i), oE: e(t) }, grid(N * D));
      },
      embeddingBackward: (dE, ids, dout, N, D) => {
        if (N === 0 || D === 0) return;
        const { csr, U } = this.occurrences(ids, N),
          g = bindR(dout),
          o = arena.bind(dE, "rw");
        const f = { n: U * D, U, D, oE: e(o), oC: e(csr), oD: e(g) };
        d("embeddingBackward", [o, csr, g], f, grid(U * D));
      },
      rmsnormForward: (out, rstd, x, w, N, D, eps) => {
        const xb = bindR(x),
          wb = bindR(w),
          o = arena.bind(out, "w"),
          r = arena.bind(rstd, "w");
        const f = { N, D, oO: e(o), oR: e(r), oX: e(xb), oW: e(wb), eps };
        d("rmsnormForward", [o, r, xb, wb], f, grid(N, 1));
      },
      rmsnormBackward: (dx, dw, dout, x, w, rstd, N, D) => {
        if (N === 0 || D === 0) return;
        const g = bindR(dout),
          xb = bindR(x),
          wb = bindR(w),
          r = bindR(rstd),
          o = arena.bind(dx, "rw"),
          ow = arena.bind(dw, "rw"); // written by the deferred rmsnormBackwardW (flushNorms)
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
          pb = arena.own(this.part!, this.part!.size / 4);
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
          oq = arena.bind(q, "rw"),
          ok = arena.bind(kk, "rw");
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
          o = arena.bind(out, "w"),
          l = arena.bind(lse, "w");
        d(
          "attentionForward",
          [o, l, qb, kb, vb],
          {
            T,
            H,
            K,
            n4: Math.ceil(E / 4),
            oO: e(o),
            oL: e(l),
            oQ: e(qb),
            oK: e(kb),
            oV: e(vb),
            scale: 1 / Math.sqrt(E),
          },
          [Math.ceil(T / ATT_BQ), B * H],
          { E },
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
          oq = arena.bind(dq, "w"),
          ok = arena.bind(dk, "w"),
          ov = arena.bind(dv, "w");
        const f = {
          B,
          T,
          H,
          K,
          n4: Math.ceil(E / 4),
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
        d("attentionBackward", [oq, ok, ov, g, qb, kb, vb, ob, l], f, grid(blocks, 1), { E });
      },
      attentionCachedForward: (out, q, kCache, vCache, P, T, H, K, E) => {
        attentionFits(E);
        const qb = bindR(q),
          kb = bindR(kCache),
          vb = bindR(vCache),
          o = arena.bind(out, "w");
        d(
          "attentionCachedForward",
          [o, qb, kb, vb],
          { P, T, H, K, n4: Math.ceil(E / 4), oO: e(o), oQ: e(qb), oK: e(kb), oV: e(vb), scale: 1 / Math.sqrt(E) },
          [Math.ceil(T / ATT_BQ), H],
          { E },
        );
      },
      swigluForward: (out, gate, up, n) => {
        const g = bindR(gate),
          u = bindR(up),
          o = arena.bind(out, "w");
        d("swigluForward", [o, g, u], { n, oO: e(o), oG: e(g), oU: e(u) }, grid(n));
      },
      swigluBackward: (dgate, dup, dout, gate, up, n) => {
        const g = bindR(gate),
          u = bindR(up),
          go = bindR(dout),
          og = arena.bind(dgate, "w"),
          ou = arena.bind(dup, "w");
        const f = { n, oDG: e(og), oDU: e(ou), oDO: e(go), oG: e(g), oU: e(u) };
        d("swigluBackward", [og, ou, go, g, u], f, grid(n));
      },
      crossEntropy: (logits, targets, rows, V, gradScale) => {
        if (rows === 0) return 0;
        let targeted = 0;
        for (let r = 0; r < rows; r++) if (targets[r] >= 0) targeted++;
        const t = bindR(targets),
          x = arena.bind(logits, gradScale > 0 ? "rw" : "r"),
          l = arena.lossRows(rows, targeted);
        const f = { rows, V, oX: e(x), oT: e(t), oL: e(l), gs: gradScale };
        d("crossEntropy", [x, t, l], f, grid(rows, 1));
        return 0; // deferred: settle() returns the loss
      },
      copy: (dst, src) => {
        if (dst.length !== src.length) throw new RangeError(`copy: ${dst.length} floats from ${src.length}`);
        const s = bindR(src),
          o = arena.bind(dst, "w");
        d("copy", [o, s], { n: src.length, oD: e(o), oS: e(s) }, grid(src.length));
      },
      fill: (x, value) => {
        if (value === 0) {
          // cleared in the command stream (no dispatch), after any pending dw it overlaps
          const m = arena.mirrorOf(x) as Mirror;
          this.flushFor([{ buffer: m.gpu, offset: x.byteOffset - m.start, size: x.byteLength, elem: 0 }]);
          arena.clear(x);
          return;
        }
        const o = arena.bind(x, "w");
        d("fill", [o], { n: x.length, oD: e(o), value }, grid(x.length));
      },
      weightsAre: (params) => arena.weightsAre(params),
      weightsChanged: () => arena.weightsChanged(),
      constant: (a) => arena.constant(a),
      traffic: () => ({ ...structuredClone(arena.counts), dispatches: this.rec.dispatches }),
      // the logits of one chunk in one binding (at most 1 GiB): fewer chunks, fewer dispatches
      headChunkTokens: (V) =>
        Math.max(Math.floor((1 << 24) / V), Math.floor(Math.min(arena.maxBinding, 1 << 30) / (4 * V))),
      fold: (slot, g, first) => this.fold(slot, g, first),
      endMicroBatch: () => {
        this.flushNorms(); // the micro-batch's own, in its commands
        arena.cut();
        this.rec.submit();
        return this.device.queue.onSubmittedWorkDone();
      },
      settle: (readback, opts) => {
        this.flushNorms(); // before the readback, in the command stream
        return arena.settle(readback, opts);
      },
      dispose: () => this.rec.dispose(),
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
      c = this.arena.bind(cos, "r"),
      s = this.arena.bind(sin, "r"),
      o = this.arena.bind(x, "rw");
    this.rec.dispatch(
      "rope",
      [o, c, s],
      { n: B * T * nh * h, T, nh, h, oX: o.elem, oC: c.elem, oS: s.elem, sign },
      grid(B * T * nh * h),
    );
  }

  /** Records one dispatch (recorder.ts), for tests (webgpuEngineOn). */
  dispatch<N extends ShaderName>(
    name: N,
    ops: Bound[],
    params: ParamsOf<N>,
    g: [number, number] | [number, number, number],
  ): void {
    this.rec.dispatch(name, ops, params, g);
  }

  /** Profile mode: each shader's dispatches and device time so far (settle() brings the times in). */
  profile(): Map<string, { calls: number; ms: number }> {
    return this.rec.profile();
  }
}

/**
 * This thread's webgpu engine: its own adapter and device, on `gpu` (gpus.ts; else Dawn's first adapter), or why
 * there is none (the caller refuses with the fix, P1). Each rank thread calls it for itself. `device` says which
 * GPU it opened: the GPU's words and the adapter's own name.
 */
export async function createWebgpuKernels(
  gpu: GpuSelect | null = null,
): Promise<{ kernels: DeferredKernels; device: string } | WebgpuUnavailable> {
  const d = await openWebgpuDevice({ gpu });
  if ("reason" in d) return d;
  const opened = d.adapter.info?.device || "unnamed";
  return {
    kernels: new WebgpuEngine(d.device, d.name).kernels(),
    device: `${gpu?.label ?? "the adapter Dawn picks"} (opened: ${opened})`,
  };
}

/**
 * The engine in profile mode (the bench's webgpu case): every dispatch timed by timestamp queries, `profile()`
 * giving each shader's calls and device milliseconds; or why it cannot run (no adapter, or no timestamp-query).
 */
export async function createProfiledWebgpuKernels(): Promise<
  { kernels: DeferredKernels; profile: () => Map<string, { calls: number; ms: number }> } | WebgpuUnavailable
> {
  const d = await openWebgpuDevice({ profile: true });
  if ("reason" in d) return d;
  if (!d.device.features?.has("timestamp-query"))
    return { reason: `${d.name} offers no timestamp-query`, fix: "run the profile on an adapter that has it" };
  const engine = new WebgpuEngine(d.device, d.name, { profile: true });
  return { kernels: engine.kernels(), profile: () => engine.profile() };
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
): { kernels: DeferredKernels; dispatch: WebgpuEngine["dispatch"] } {
  const engine = new WebgpuEngine(device, name, opts);
  return { kernels: engine.kernels(), dispatch: engine.dispatch.bind(engine) };
}
