/**
 * P8: `node dist/main.js --world 2 --demo --precision bf16 --isa amx` with OpenBLAS hidden ends with the bf16 demo's
 * pinned final weights (DEMO_BF16_SHA256, test/helpers/demo.ts): the AMX-BF16 (TDPBF16PS) kernel, as the other bf16
 * file checks for the emulation on AVX2. Every kernel's bits at one model step: model.bf16.test.ts.
 */
import { demoOnKernel } from "./helpers/demo";

demoOnKernel("amx", "bf16");
