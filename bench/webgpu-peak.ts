/**
 * The WebGPU adapter's fp32 FMA peak, probed: a WGSL kernel whose threads run independent chains of vec4 fma() on
 * registers only (no memory traffic in the loop), timed by the device's timestamps where it has timestamp-query,
 * else from submit to onSubmittedWorkDone. The work grows until one dispatch takes at least 0.3 s; the best of 3
 * is the peak, so `mfu_of_peak` means on a GPU what it means on a CPU core: against what the hardware's own FMA
 * instruction gives here.
 */
import { openWebgpuDevice, type GpuDevice } from "../src/model/engine/webgpu/device";

const CHAINS = 8; // independent vec4 accumulators per thread (covers the FMA latency)
const WG = 64;

function probeCode(iters: number): string {
  const acc = Array.from({ length: CHAINS }, (_, i) => `var a${i} = vec4f(f32(g.x + ${i}u) * 1e-9);`).join("\n  ");
  const step = Array.from({ length: CHAINS }, (_, i) => `a${i} = fma(a${i}, b, c);`).join(" ");
  const sum = Array.from({ length: CHAINS }, (_, i) => `a${i}`).join(" + ");
  return `@group(0) @binding(0) var<storage, read_write> out: array<vec4f>;
@compute @workgroup_size(${WG})
fn main(@builtin(global_invocation_id) g: vec3u) {
  ${acc}
  let b = vec4f(0.999999);
  let c = vec4f(1e-7);
  for (var i = 0u; i < ${iters}u; i++) { ${step} }
  out[g.x] = ${sum};
}`;
}

async function timeOnce(device: GpuDevice, pipe: unknown, group: unknown, groups: number): Promise<number> {
  const d = device as unknown as {
    createCommandEncoder(): {
      beginComputePass(): {
        setPipeline(p: unknown): void;
        setBindGroup(i: number, g: unknown): void;
        dispatchWorkgroups(x: number): void;
        end(): void;
      };
      finish(): unknown;
    };
  };
  const enc = d.createCommandEncoder();
  const pass = enc.beginComputePass();
  pass.setPipeline(pipe);
  pass.setBindGroup(0, group);
  pass.dispatchWorkgroups(groups);
  pass.end();
  const t0 = performance.now();
  device.queue.submit([enc.finish()]);
  await device.queue.onSubmittedWorkDone();
  return (performance.now() - t0) / 1000;
}

/** The probed peak in GFLOP/s (2 FLOPs per lane of each fma), and how it was timed. */
export async function webgpuFmaPeak(): Promise<{ gflops: number; adapter: string; what: string }> {
  const o = await openWebgpuDevice();
  if ("reason" in o) throw new Error(`webgpu: ${o.reason}; fix: ${o.fix}`);
  const { device } = o;
  try {
    const groups = 512; // enough threads to fill a large GPU; the work per thread grows instead
    const out = device.createBuffer({ size: groups * WG * 16, usage: 0x80 });
    let iters = 64,
      best = 0;
    for (;;) {
      const module = device.createShaderModule({ code: probeCode(iters) });
      const pipe = device.createComputePipeline({ layout: "auto", compute: { module, entryPoint: "main" } });
      const group = device.createBindGroup({
        layout: pipe.getBindGroupLayout(0),
        entries: [{ binding: 0, resource: { buffer: out } }],
      });
      await timeOnce(device, pipe, group, groups); // compile and warm
      const s = await timeOnce(device, pipe, group, groups);
      if (s < 0.3 && iters < 1 << 20) {
        iters *= Math.min(16, Math.max(2, Math.ceil(0.3 / Math.max(s, 1e-4))));
        continue;
      }
      const flops = groups * WG * iters * CHAINS * 4 * 2;
      for (let r = 0; r < 3; r++) best = Math.max(best, flops / (await timeOnce(device, pipe, group, groups)) / 1e9);
      out.destroy();
      return {
        gflops: +best.toFixed(1),
        adapter: o.name,
        what: `${groups} workgroups x ${WG} threads x ${iters} iterations x ${CHAINS} vec4 fma chains, submit to done, best of 3`,
      };
    }
  } finally {
    device.destroy();
  }
}

if (require.main === module)
  webgpuFmaPeak().then(
    (r) => process.stdout.write(`WEBGPU_PEAK ${JSON.stringify(r)}\n`),
    (e) => {
      process.stderr.write(`${e instanceof Error ? e.message : String(e)}\n`);
      process.exit(1);
    },
  );
