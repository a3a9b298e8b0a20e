{
  "targets": [
    {
      "target_name": "tstrain_native",
      "sources": [
        "native/tstrain.c",
        "native/napi.c",
        "native/setup.c",
        "native/ops/rows.c",
        "native/ops/attention.c",
        "native/ops/optim.c",
        "native/probes.c",
        "native/peak.c",
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
      "cflags": ["-O3", "-ffp-contract=off", "-fno-fast-math", "-fno-trapping-math", "-std=c11", "-D_GNU_SOURCE", "-Wall", "-Wno-unused-parameter"],
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
