/*
 * The inline-assembly pieces both x86 tile kernels are built from (kernels/avx2.c, kernels/avx512.c): one k of the
 * first six rows of a tile (A strided or from row pointers), the pointer steps, and the k loop.
 */
#ifndef TSTRAIN_GEMM_TILE_ASM_H
#define TSTRAIN_GEMM_TILE_ASM_H
/* One k of the tile's rows: A strided (a(r, p) at a + p*sa + 4r; X = ",%[sa]": the next k) or from six row pointers
 * (a(r, p) at a + r*la + 4p; D = "4": the next k) */
/* clang-format off */
#define A6_STRIDED(ROW, R0, R1, X)                                                                                     \
  ROW("0(%[a]" X ")", R0, "0", "1") ROW("4(%[a]" X ")", R1, "2", "3") ROW("8(%[a]" X ")", R0, "4", "5")                \
      ROW("12(%[a]" X ")", R1, "6", "7") ROW("16(%[a]" X ")", R0, "8", "9") ROW("20(%[a]" X ")", R1, "10", "11")
#define A6_ROWS(ROW, R0, R1, D)                                                                                        \
  ROW(D "(%[a])", R0, "0", "1") ROW(D "(%[a],%[la],1)", R1, "2", "3") ROW(D "(%[a],%[la],2)", R0, "4", "5")            \
      ROW(D "(%[a],%[la3],1)", R1, "6", "7") ROW(D "(%[a4])", R0, "8", "9") ROW(D "(%[a4],%[la],1)", R1, "10", "11")
/* clang-format on */
/* One k (B loaded by the loop), and two k with their B loads (the loop's usual step: fewer pointer updates and loop
 * branches a k, 1-5 % faster on both kernels); the flags of the k count end each */
#define STEP_STRIDED                                                                                                   \
  "add %[sa], %[a]\n\t"                                                                                                \
  "add %[sb], %[b]\n\t"                                                                                                \
  "dec %[k]\n\t"
#define PAIR_STRIDED                                                                                                   \
  "lea (%[a],%[sa],2), %[a]\n\t"                                                                                       \
  "add %[sb], %[b]\n\t"                                                                                                \
  "sub $2, %[k]\n\t"
#define STEP_ROWS                                                                                                      \
  "add $4, %[a]\n\t"                                                                                                   \
  "add $4, %[a4]\n\t"                                                                                                  \
  "add %[sb], %[b]\n\t"                                                                                                \
  "dec %[k]\n\t"
#define PAIR_ROWS                                                                                                      \
  "add $8, %[a]\n\t"                                                                                                   \
  "add $8, %[a4]\n\t"                                                                                                  \
  "add %[sb], %[b]\n\t"                                                                                                \
  "sub $2, %[k]\n\t"
#define TILE_PAIR(LOAD_B, A, NEXT, BUMP) LOAD_B A("") "add %[sb], %[b]\n\t" LOAD_B A(NEXT) BUMP
/* The k loop of every tile kernel, twice: with d == NULL in pairs of k (an odd k first); else one k at a time,
 * each B row read also stored to d, the next row right after it (small products: the first row tile of a column lays
 * out the sliver the others then read) */
#define TILE_LOOPS(LOAD_B, STORE_B, K_STEP, K_PAIR)                                                                    \
  "test %[d], %[d]\n\t"                                                                                                \
  "jnz 8f\n\t"                                                                                                         \
  "test $1, %[k]\n\t"                                                                                                  \
  "jz 4f\n\t" LOAD_B K_STEP                                                                                            \
  "jz 5f\n\t"                                                                                                          \
  "4:\n\t" K_PAIR                                                                                                      \
  "jnz 4b\n\t"                                                                                                         \
  "jmp 5f\n\t"                                                                                                         \
  "8:\n\t" LOAD_B STORE_B K_STEP "jnz 8b\n\t"
#endif
