/**
 * P8: `node dist/main.js --world 2 --demo --precision bf16 --isa avx512` with OpenBLAS hidden ends with the bf16
 * demo's pinned final weights (DEMO_BF16_SHA256, test/helpers/demo.ts): the emulation on the AVX-512 kernel, with
 * the row kernels' AVX-512 copy (the default where a CPU has AVX-512 and no AMX), as the other bf16 files check for
 * the AVX2 and AMX kernels.
 */
import { demoOnKernel } from "./helpers/demo";

demoOnKernel("avx512", "bf16");
