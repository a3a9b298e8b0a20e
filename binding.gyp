{
  # Two Node-API addons of the C engine (native/README.md) and the MPI binding. The trainer loads tstrain_native
  # only; tstrain_probes (the bench's and the tests' probes, native/probes.c and peak.c) is built from its own copy of
  # the engine's GEMM, row kernels and Node-API pieces (engine_common), so neither addon calls into the other.
  "variables": {
    "engine_common": [
      "native/napi.c",
      "native/setup.c",
      "native/ops/rows.c",
      "native/gemm/frame.c",
      "native/gemm/pack.c",
      "native/gemm/bf16.c",
      "native/gemm/weights.c",
      "native/gemm/kernels/portable.c",
      "native/gemm/kernels/avx2.c",
      "native/gemm/kernels/avx512.c",
      "native/gemm/kernels/amx.c",
      "native/gemm/kernels/avx512bf16.c"
    ],
    "engine_cflags": ["-O3", "-ffp-contract=off", "-fno-fast-math", "-fno-trapping-math", "-std=c11", "-D_GNU_SOURCE", "-Wall", "-Wno-unused-parameter"]
  },
  "targets": [
    {
      "target_name": "tstrain_native",
      "sources": [
        "native/tstrain.c",
        "native/ops/attention.c",
        "native/ops/optim.c",
        "<@(engine_common)"
      ],
      "cflags": ["<@(engine_cflags)"],
      "libraries": ["-ldl", "-lm", "-lpthread"],
      "xcode_settings": {
        "OTHER_CFLAGS": ["-O3", "-ffp-contract=off", "-fno-fast-math", "-std=c11"]
      }
    },
    {
      "target_name": "tstrain_probes",
      "sources": [
        "native/probes.c",
        "native/peak.c",
        "<@(engine_common)"
      ],
      "defines": ["TSTRAIN_PROBES"],
      "cflags": ["<@(engine_cflags)"],
      "libraries": ["-ldl", "-lm", "-lpthread"],
      "xcode_settings": {
        "OTHER_CFLAGS": ["-O3", "-ffp-contract=off", "-fno-fast-math", "-std=c11"]
      }
    },
    {
      "target_name": "tstrain_mpi",
      "sources": ["native/mpi.c"],
      "cflags": ["-O2", "-std=c11", "-D_GNU_SOURCE", "-Wall", "-Wno-unused-parameter"],
      "libraries": ["-ldl"]
    }
  ]
}
