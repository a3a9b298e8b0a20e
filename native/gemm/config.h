/*
 * The GEMM's block sizes and register tiles, in one place (BLIS' "configuration"): per kernel its register tile
 * MR x NR, its A block MC, K block KC, B panel NC and KONE (a K up to it runs as one block; 0: the KC blocks always),
 * and the drivers' and the bf16 paths' own sizes. None of them changes the bits: every C element is one chain over k
 * in order whatever the blocking (a chain that crosses a K block is stored in fp32 and reloaded, exact), so a new
 * size needs only speed measured (bench/native/gemm-ab.sh) and its hashes checked (the same script).
 */
#ifndef TSTRAIN_GEMM_CONFIG_H
#define TSTRAIN_GEMM_CONFIG_H

/* portable C (any CPU): 4 x 16 */
#define P_MR 4
#define P_NR 16
#define P_MC 128
#define P_KC 256
#define P_NC 2048
#define P_KONE 0

/* AVX2 + FMA: 6 x 16 (12 accumulators). Its blocks come from this CPU's caches (frame.c: gemm_blocks_setup, read once
 * from sysfs, else from the C library's CPUID-based sysconf), as BLIS's per-architecture configurations choose theirs
 * for each CPU, by a rule instead of a table; a cache that cannot be read counts as the smallest of these CPUs'
 * (A2_L1 32 KiB 8-way, A2_L2 512 KiB 8-way: Zen 2 and 3). In this driver's loop order (frame.c: blocked) the A
 * sliver (mr x kc) stays in L1 for a row of tiles while the B slivers (kc x nr) stream past it from the B panel in
 * L2, and each A block (mc x kc) is packed and then read once, a sliver at a time:
 *   KC: the A sliver and one B sliver, (mr + nr) x kc floats, in L1 with one way left for C's tile, a multiple of 32
 *       (bf16's chunk), at most A2_KC_MAX (BLIS's own KC for every AVX2 core; a larger one measured slower on a Zen 5,
 *       its panels narrower: A packed again per panel) and at least 64. 256 on Zen 2/3/4/5 and Intel's cores since
 *       Haswell; 160 on a 16 KiB 8-way L1, 128 on a 16 KiB 4-way one.
 *   NC: one panel holds all of N where kc x N is at most 3/4 of L2 (the A block beside it); else panels of at most
 *       half of L2 (the previous fixed cap, 1 MB, is twice a Zen 3's whole L2: its panels spilled to L3).
 *   MC: the A block in the quarter of L2 the panel leaves, a multiple of mr: 126 on a Zen 3's 512 KiB, 252 on 1 MiB.
 * None of them changes a bit: each C element is one chain over k in order, in any blocks. */
#define A2_MR 6
#define A2_NR 16
#define A2_KC_MAX 256
#define A2_NC 3072
#define A2_KONE 0
#define A2_L1 (32 * 1024)
#define A2_L1_WAYS 8
#define A2_L2 (512 * 1024)
#define A2_DIRECT_KC 256 /* direct(): A stored [K,M] in K blocks of at most this (see there) */

/* AVX-512F: 8 x 32 (16 accumulators) */
#define A5_MR 8
#define A5_NR 32
#define A5_MC 192
#define A5_KC 384
#define A5_NC 3072
#define A5_KONE 640
#define A5_DIRECT_KC 0 /* direct(): K in one block */

/* AVX512_BF16 (VDPBF16PS, bf16.c's order): 6 x 32, 24 stream accumulators (even and odd, 6 x 2 vectors each: twice
 * VDPBF16PS's 6-cycle latency at 2 per cycle), the tile's running sum kept in L1. DP_MC rows of A (DP_MC_T where A is
 * stored [K,M]: longer runs along its rows; multiples of DP_MR) and DP_KC of k (a multiple of 32) per packed A block;
 * a K up to DP_KONE runs as one block. */
#define DP_MR 6
#define DP_NR 32
#define DP_MC 384
#define DP_MC_T 768
#define DP_KC 512
#define DP_KONE 640

/* The drivers (frame.c) */
#define DIRECT_MAX_M 64 /* a product with at most this many rows runs read in place (direct()) */
/* blocked()'s packed B panel, kept in L2, in floats (the AVX-512 and portable kernels; AVX2: above): at most PANEL
 * (1 MB) where one panel holds all of N; where N takes several, half the bytes of this core's L2 (1 MB where L2 is
 * 2 MB, 512 KB on a Zen 4's 1 MB), from PANEL_MIN to PANEL */
#define PANEL ((int64_t)1 << 18)
#define PANEL_MIN ((int64_t)1 << 16)
#define WS_BAND ((int64_t)1 << 20) /* floats (4 MB): gemm_sgemm's bands of C when beta != 0 over several K blocks */

/* bf16 (bf16.c, kernels/amx.c, weights.c) */
#define BF_CHUNK 32                 /* TDPBF16PS's chunk of k: 16 even and 16 odd k */
#define BF_TILE_MAX (A5_MR * A5_NR) /* the largest register tile, mr x nr */
#define A_WHOLE                                                                                                        \
  ((int64_t)1                                                                                                          \
   << 20) /* the x86 emulations pack A whole (at most this many floats: 4 MB) where N takes several B panels */
#define AMX_KC 512
#define AMX_KC_ONE 2048 /* a K up to this runs as one block: each tile's sum is whole and meets C in the tile's store */
#define AMX_MC 256
#define AMX_NC 1024
#define WCACHE_MAX 1024 /* the weights' packed copies kept (weights.c) */

#endif
