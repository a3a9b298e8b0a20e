{
  "targets": [
    {
      "target_name": "tstrain_native",
      "sources": ["native/tstrain.c", "native/gemm.c"],
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
