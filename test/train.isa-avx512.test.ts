/**
 * The same bits on every x86-64 machine, kernel by kernel: `node dist/main.js --world 2 --demo --isa avx512` with
 * OpenBLAS hidden ends with the demo's pinned final weights (DEMO_SHA256, test/helpers/demo.ts), as the other
 * kernels' files check for theirs: a machine whose kernels or compiler round differently fails here, and so does a
 * change of results that was not meant.
 */
import { demoOnKernel } from "./helpers/demo";

demoOnKernel("avx512");
