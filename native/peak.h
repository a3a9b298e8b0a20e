/*
 * The bench's probes of this core's peak (native/peak.c), against which it reads the GEMM's speed; not part of the
 * GEMM (gemm.h), which never calls them. The addon exports them as gemmPeak; bench/native/gemm-ab.c calls them too.
 */
#ifndef TSTRAIN_PEAK_H
#define TSTRAIN_PEAK_H
#include <stdint.h>

#include "gemm.h"

/* This thread's CPU seconds (CLOCK_THREAD_CPUTIME_ID): what the peak probes and the bench's timed products count. */
double gemm_thread_seconds(void);
/* GFLOP/s of this core on 12 independent register-only FMA chains of the kernel's instruction set, over iters
 * rounds (the peak a GEMM on that kernel is measured against); 0 when the CPU lacks it. */
double gemm_fma_peak(gemm_isa isa, int64_t iters);
/* GFLOP/s of this core on 6 independent register-only TDPBF16PS tiles (16 x 16 x 32 x 2 flops each); 0 without AMX. */
double gemm_bf16_peak(int64_t iters);
/* GFLOP/s of this core on 24 independent register-only VDPBF16PS chains (16 lanes x 2 products x 2 flops each); 0
 * where gemm_bf16_dp_supported is not. */
double gemm_dp_peak(int64_t iters);

#endif
