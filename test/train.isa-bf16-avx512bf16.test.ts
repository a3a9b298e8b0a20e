/**
 * P8: `node dist/main.js --world 2 --demo --precision bf16 --isa avx512bf16` with OpenBLAS hidden ends with the bf16
 * demo's pinned final weights (DEMO_BF16_SHA256, test/helpers/demo.ts): the VDPBF16PS kernel (AVX512_BF16) gives the
 * same bits as the AMX kernel and the emulations. Skipped, saying why, on a CPU without AVX512_BF16.
 */
import { demoOnKernel } from "./helpers/demo";

demoOnKernel("avx512bf16", "bf16");
