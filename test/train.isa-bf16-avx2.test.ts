/**
 * P8: `node dist/main.js --world 2 --demo --precision bf16 --isa avx2` with OpenBLAS hidden ends with the bf16
 * demo's pinned final weights (DEMO_BF16_SHA256, test/helpers/demo.ts): the emulation on the AVX2 kernel, as
 * the other bf16 file checks for the AMX kernel. Every kernel's bits at one model step: model.bf16.test.ts.
 */
import { demoOnKernel } from "./helpers/demo";

demoOnKernel("avx2", "bf16");
