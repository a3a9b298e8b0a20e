/*
 * tstrain's own single-precision GEMM (native/gemm/, its map in native/README.md): row-major
 * C = alpha * op(A) @ op(B) + beta * C, in one order of summation on every instruction set, so the AVX-512, AVX2
 * and portable kernels give the same bits; and its bf16 products. The public API: everything else in native/gemm/ is
 * internal (gemm/internal.h).
 */
#ifndef TSTRAIN_GEMM_H
#define TSTRAIN_GEMM_H
#include <stdint.h>

/* The micro-kernels, widest first. GEMM_ISA_AUTO picks the widest the CPU (and OS) supports. */
typedef enum { GEMM_ISA_PORTABLE = 0, GEMM_ISA_AVX2 = 1, GEMM_ISA_AVX512 = 2, GEMM_ISA_AUTO = 3 } gemm_isa;

/* The widest kernel this CPU runs (never GEMM_ISA_AUTO). */
gemm_isa gemm_best_isa(void);
/* Whether this CPU runs the kernel (portable: always). */
int gemm_isa_supported(gemm_isa isa);
/* "avx512", "avx2", "portable" */
const char *gemm_isa_name(gemm_isa isa);
/* e.g. "AVX-512F 8x32" (the register tile, rows x columns of C) */
const char *gemm_isa_detail(gemm_isa isa);

/*
 * C[M,N] = alpha * op(A) @ op(B) + beta * C, the cblas_sgemm row-major contract: op(A) is [M,K] (A[i*lda+k], or
 * A[k*lda+i] when ta), op(B) is [K,N] (B[k*ldb+j], or B[j*ldb+k] when tb), C[i*ldc+j]. beta = 0 ignores C's old
 * contents (even NaN). The order, on every kernel: a = alpha*A[i,k] rounded to float (alpha = 1: A itself),
 * s = 0, then s = fma(a[i,k], B[k,j], s) for k = 0, 1, ..., K-1, then C = s (beta 0), C + s (beta 1) or
 * fma(beta, C, s). Returns 0, or -1 when it could not allocate its packing buffers (C untouched).
 * isa must be supported by the CPU (gemm_isa_supported); GEMM_ISA_AUTO takes gemm_best_isa().
 */
int gemm_sgemm(gemm_isa isa, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
               const float *B, int64_t ldb, float beta, float *C, int64_t ldc);

/* gemm_bf16's kernels: the emulation on an fp32 micro-kernel, AMX-BF16's TDPBF16PS, AVX512_BF16's VDPBF16PS. */
enum { GEMM_BF16_EMULATED = 0, GEMM_BF16_AMX = 1, GEMM_BF16_DP = 2 };

/*
 * bf16 products: as gemm_sgemm with alpha 1, every element of op(A) and op(B) first rounded to bf16 (to nearest
 * even; a denormal read as 0), each C element summed in AMX's TDPBF16PS order: K padded with zeros to a multiple
 * of 32 and cut into chunks of 32; per chunk e = chain over its 16 even k, o = chain over its 16 odd k, each from 0
 * (e = fma(a[k], b[k], e)), then acc = acc + (e + o), acc from 0; then C = acc, C + acc or fma(beta, C, acc). Every
 * result that is tiny (below 2^-126 once rounded to 24 bits with an unbounded exponent: x86's rule) is flushed to 0,
 * and every denormal input read as 0. hw: GEMM_BF16_AMX runs the AMX kernel where the CPU (and OS) has it,
 * GEMM_BF16_DP the VDPBF16PS kernel where the CPU has it and it passed its self-check; otherwise, and with
 * GEMM_BF16_EMULATED, isa's fp32 kernel on the rounded operands (or the portable one): the same bits every way.
 * Returns 0, or -1 (out of memory).
 */
int gemm_bf16(gemm_isa isa, int hw, int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
              const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
/* Whether this CPU has AMX-BF16 and the OS lets this process use it (the hardware kernel of gemm_bf16). */
int gemm_bf16_hw_supported(void);
/* Whether this CPU has AVX512_BF16 and its VDPBF16PS passed the start-up self-check against the emulation (run once,
 * on the first call); gemm_bf16_dp_status says why not ("" when it did). */
int gemm_bf16_dp_supported(void);
const char *gemm_bf16_dp_status(void);
/* The process's weights, [base, base + n): gemm_bf16's AMX and VDPBF16PS kernels keep each B operand that lies there packed
 * (shared by every thread) until gemm_bf16_weights_changed, which the trainer calls after every update of them. The
 * bits are those of packing B every time. Each call (the same range again included) makes the kept copies stale;
 * n = 0 forgets the range. */
void gemm_bf16_weights(const float *base, int64_t n);
void gemm_bf16_weights_changed(void);
/* Remakes the stale copies kept for the weights, entry i when i % parts == part (each rank its share, side by side). */
void gemm_bf16_weights_prepack(int part, int parts);

/* Frees this thread's packing buffers (the next call allocates them again). */
void gemm_thread_release(void);

#endif
