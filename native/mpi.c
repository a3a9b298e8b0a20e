/*
 * tstrain_mpi: the few MPI calls the trainer makes across processes, as a Node-API addon of its own.
 *
 * MPI is not linked: `load(path)` dlopens libmpi (Open MPI's libmpi.so.40 by default) with RTLD_GLOBAL (Open
 * MPI's plugins resolve libmpi's symbols from the global namespace) and resolves every function with dlsym, so
 * this addon builds without MPI headers and loads on a machine without MPI. Open MPI's handles are the addresses
 * of exported globals (MPI_COMM_WORLD is &ompi_mpi_comm_world, MPI_DOUBLE &ompi_mpi_double, ...): they are
 * fetched the same way. MPICH-family libraries (integer handles) are refused by load() with the reason.
 *
 * Collectives run on libuv's thread pool (napi async work), never on the JS thread that calls them: the
 * coordinator's event loop stays responsive while a collective waits for the other processes. The caller
 * issues one collective at a time, in the same order on every process (src/mpi/world.ts queues them).
 *
 * Exports:
 *   load(path) -> null | "reason"          dlopen + dlsym; idempotent
 *   init() -> { rank, size, provided }     MPI_Init_thread(MPI_THREAD_MULTIPLE)
 *   bcast(view, root) -> Promise           MPI_Bcast of the view's bytes
 *   allgather(send, recv) -> Promise       MPI_Allgather of bytes: recv = size blocks of send.byteLength
 *   reduceScatterSum(send, recv) -> Promise MPI_Reduce_scatter_block, float64 MPI_SUM; recv = this process's block
 *   barrier() -> Promise
 *   finalize()                             MPI_Finalize
 *   abort(code)                            MPI_Abort(MPI_COMM_WORLD, code): ends every process of the job
 */
#define NAPI_VERSION 8
#include <node_api.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void *MPI_Comm;
typedef void *MPI_Datatype;
typedef void *MPI_Op;

static void *lib = NULL;
static int (*p_init_thread)(int *, char ***, int, int *);
static int (*p_comm_rank)(MPI_Comm, int *);
static int (*p_comm_size)(MPI_Comm, int *);
static int (*p_bcast)(void *, int, MPI_Datatype, int, MPI_Comm);
static int (*p_allgather)(const void *, int, MPI_Datatype, void *, int, MPI_Datatype, MPI_Comm);
static int (*p_reduce_scatter_block)(const void *, void *, int, MPI_Datatype, MPI_Op, MPI_Comm);
static int (*p_barrier)(MPI_Comm);
static int (*p_finalize)(void);
static int (*p_abort)(MPI_Comm, int);
static MPI_Comm comm_world;
static MPI_Datatype dt_byte, dt_double;
static MPI_Op op_sum;

#define MPI_THREAD_MULTIPLE_OMPI 3

#define CHECK(env, call)                                                                                               \
  do {                                                                                                                 \
    if ((call) != napi_ok) {                                                                                           \
      napi_throw_error((env), NULL, "tstrain_mpi: Node-API call failed: " #call);                                      \
      return NULL;                                                                                                     \
    }                                                                                                                  \
  } while (0)

static napi_value str(napi_env env, const char *s) {
  napi_value v;
  napi_create_string_utf8(env, s, NAPI_AUTO_LENGTH, &v);
  return v;
}

static napi_value js_load(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1];
  CHECK(env, napi_get_cb_info(env, info, &argc, argv, NULL, NULL));
  if (lib) {
    napi_value n;
    napi_get_null(env, &n);
    return n;
  }
  char path[4096];
  size_t len = 0;
  if (argc < 1 || napi_get_value_string_utf8(env, argv[0], path, sizeof path, &len) != napi_ok) {
    napi_throw_type_error(env, NULL, "load(path): path must be a string");
    return NULL;
  }
  void *h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
  if (!h) {
    const char *e = dlerror();
    return str(env, e ? e : "dlopen failed");
  }
  struct {
    const char *name;
    void **slot;
  } syms[] = {
      {"MPI_Init_thread", (void **)&p_init_thread},
      {"MPI_Comm_rank", (void **)&p_comm_rank},
      {"MPI_Comm_size", (void **)&p_comm_size},
      {"MPI_Bcast", (void **)&p_bcast},
      {"MPI_Allgather", (void **)&p_allgather},
      {"MPI_Reduce_scatter_block", (void **)&p_reduce_scatter_block},
      {"MPI_Barrier", (void **)&p_barrier},
      {"MPI_Finalize", (void **)&p_finalize},
      {"MPI_Abort", (void **)&p_abort},
      {"ompi_mpi_comm_world", &comm_world},
      {"ompi_mpi_byte", &dt_byte},
      {"ompi_mpi_double", &dt_double},
      {"ompi_mpi_op_sum", &op_sum},
  };
  for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
    void *p = dlsym(h, syms[i].name);
    if (!p) {
      char msg[4800];
      snprintf(msg, sizeof msg,
               "%s has no symbol %s (this trainer needs Open MPI 4 or later: its handles are exported globals)", path,
               syms[i].name);
      dlclose(h);
      return str(env, msg);
    }
    *syms[i].slot = p;
  }
  lib = h;
  napi_value n;
  napi_get_null(env, &n);
  return n;
}

static int need_lib(napi_env env) {
  if (lib) return 1;
  napi_throw_error(env, NULL, "tstrain_mpi: load() has not succeeded");
  return 0;
}

static napi_value js_init(napi_env env, napi_callback_info info) {
  if (!need_lib(env)) return NULL;
  int provided = 0, rank = 0, size = 0;
  if (p_init_thread(NULL, NULL, MPI_THREAD_MULTIPLE_OMPI, &provided) != 0) {
    napi_throw_error(env, NULL, "MPI_Init_thread failed");
    return NULL;
  }
  p_comm_rank(comm_world, &rank);
  p_comm_size(comm_world, &size);
  napi_value o, v;
  CHECK(env, napi_create_object(env, &o));
  napi_create_int32(env, rank, &v);
  napi_set_named_property(env, o, "rank", v);
  napi_create_int32(env, size, &v);
  napi_set_named_property(env, o, "size", v);
  napi_create_int32(env, provided, &v);
  napi_set_named_property(env, o, "provided", v);
  return o;
}

/* ------------------------------------------------------------------ async collectives */

enum op_kind { OP_BCAST, OP_ALLGATHER, OP_REDUCE_SCATTER, OP_BARRIER };

typedef struct {
  enum op_kind kind;
  napi_async_work work;
  napi_deferred deferred;
  napi_ref refs[2];
  int nrefs;
  void *a, *b;
  size_t a_bytes, b_bytes;
  int root;
  int rc;
} op_t;

static void execute(napi_env env, void *data) {
  op_t *op = (op_t *)data;
  switch (op->kind) {
    case OP_BCAST: op->rc = p_bcast(op->a, (int)op->a_bytes, dt_byte, op->root, comm_world); break;
    case OP_ALLGATHER:
      op->rc = p_allgather(op->a, (int)op->a_bytes, dt_byte, op->b, (int)op->a_bytes, dt_byte, comm_world);
      break;
    case OP_REDUCE_SCATTER:
      op->rc = p_reduce_scatter_block(op->a, op->b, (int)(op->b_bytes / 8), dt_double, op_sum, comm_world);
      break;
    case OP_BARRIER: op->rc = p_barrier(comm_world); break;
  }
}

static void complete(napi_env env, napi_status status, void *data) {
  op_t *op = (op_t *)data;
  for (int i = 0; i < op->nrefs; i++) napi_delete_reference(env, op->refs[i]);
  if (status == napi_ok && op->rc == 0) {
    napi_value u;
    napi_get_undefined(env, &u);
    napi_resolve_deferred(env, op->deferred, u);
  } else {
    char msg[128];
    snprintf(msg, sizeof msg, "MPI collective failed (status %d, MPI error %d)", (int)status, op->rc);
    napi_value e, m;
    napi_create_string_utf8(env, msg, NAPI_AUTO_LENGTH, &m);
    napi_create_error(env, NULL, m, &e);
    napi_reject_deferred(env, op->deferred, e);
  }
  napi_delete_async_work(env, op->work);
  free(op);
}

/* A typed array's bytes, and a reference that keeps it alive until the collective ends. */
static int view_bytes(napi_env env, napi_value v, op_t *op, void **data, size_t *bytes) {
  bool is_ta = false;
  napi_is_typedarray(env, v, &is_ta);
  if (!is_ta) {
    napi_throw_type_error(env, NULL, "tstrain_mpi: expected a typed array");
    return 0;
  }
  napi_typedarray_type t;
  size_t length, offset;
  napi_value ab;
  if (napi_get_typedarray_info(env, v, &t, &length, data, &ab, &offset) != napi_ok) {
    napi_throw_error(env, NULL, "tstrain_mpi: cannot read the typed array");
    return 0;
  }
  size_t el = 1;
  switch (t) {
    case napi_int16_array:
    case napi_uint16_array: el = 2; break;
    case napi_int32_array:
    case napi_uint32_array:
    case napi_float32_array: el = 4; break;
    case napi_float64_array:
    case napi_bigint64_array:
    case napi_biguint64_array: el = 8; break;
    default: el = 1;
  }
  *bytes = length * el;
  if (*bytes > 0x7fffffffu) {
    napi_throw_range_error(env, NULL, "tstrain_mpi: a buffer over 2 GiB needs splitting");
    return 0;
  }
  napi_create_reference(env, v, 1, &op->refs[op->nrefs++]);
  return 1;
}

static napi_value start(napi_env env, op_t *op, const char *name) {
  napi_value promise, resource;
  napi_create_promise(env, &op->deferred, &promise);
  napi_create_string_utf8(env, name, NAPI_AUTO_LENGTH, &resource);
  napi_create_async_work(env, NULL, resource, execute, complete, op, &op->work);
  napi_queue_async_work(env, op->work);
  return promise;
}

static op_t *new_op(napi_env env, enum op_kind kind) {
  if (!need_lib(env)) return NULL;
  op_t *op = (op_t *)calloc(1, sizeof(op_t));
  op->kind = kind;
  return op;
}

static void drop(napi_env env, op_t *op) {
  for (int i = 0; i < op->nrefs; i++) napi_delete_reference(env, op->refs[i]);
  free(op);
}

static napi_value js_bcast(napi_env env, napi_callback_info info) {
  size_t argc = 2;
  napi_value argv[2];
  CHECK(env, napi_get_cb_info(env, info, &argc, argv, NULL, NULL));
  op_t *op = new_op(env, OP_BCAST);
  if (!op) return NULL;
  if (argc < 2 || !view_bytes(env, argv[0], op, &op->a, &op->a_bytes) ||
      napi_get_value_int32(env, argv[1], &op->root) != napi_ok) {
    drop(env, op);
    return NULL;
  }
  return start(env, op, "tstrain_mpi.bcast");
}

static napi_value js_allgather(napi_env env, napi_callback_info info) {
  size_t argc = 2;
  napi_value argv[2];
  CHECK(env, napi_get_cb_info(env, info, &argc, argv, NULL, NULL));
  op_t *op = new_op(env, OP_ALLGATHER);
  if (!op) return NULL;
  if (argc < 2 || !view_bytes(env, argv[0], op, &op->a, &op->a_bytes) ||
      !view_bytes(env, argv[1], op, &op->b, &op->b_bytes)) {
    drop(env, op);
    return NULL;
  }
  int size = 0;
  p_comm_size(comm_world, &size);
  if (op->b_bytes != op->a_bytes * (size_t)size) {
    drop(env, op);
    napi_throw_range_error(env, NULL, "allgather: recv must hold size x send bytes");
    return NULL;
  }
  return start(env, op, "tstrain_mpi.allgather");
}

static napi_value js_reduce_scatter(napi_env env, napi_callback_info info) {
  size_t argc = 2;
  napi_value argv[2];
  CHECK(env, napi_get_cb_info(env, info, &argc, argv, NULL, NULL));
  op_t *op = new_op(env, OP_REDUCE_SCATTER);
  if (!op) return NULL;
  if (argc < 2 || !view_bytes(env, argv[0], op, &op->a, &op->a_bytes) ||
      !view_bytes(env, argv[1], op, &op->b, &op->b_bytes)) {
    drop(env, op);
    return NULL;
  }
  int size = 0;
  p_comm_size(comm_world, &size);
  if (op->b_bytes % 8 != 0 || op->a_bytes != op->b_bytes * (size_t)size) {
    drop(env, op);
    napi_throw_range_error(env, NULL, "reduceScatterSum: send must hold size x recv float64 values");
    return NULL;
  }
  return start(env, op, "tstrain_mpi.reduceScatterSum");
}

static napi_value js_barrier(napi_env env, napi_callback_info info) {
  op_t *op = new_op(env, OP_BARRIER);
  if (!op) return NULL;
  return start(env, op, "tstrain_mpi.barrier");
}

static napi_value js_finalize(napi_env env, napi_callback_info info) {
  if (!need_lib(env)) return NULL;
  p_finalize();
  return NULL;
}

static napi_value js_abort(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1];
  int code = 1;
  CHECK(env, napi_get_cb_info(env, info, &argc, argv, NULL, NULL));
  if (argc >= 1) napi_get_value_int32(env, argv[0], &code);
  if (!need_lib(env)) return NULL;
  fflush(stdout);
  fflush(stderr);
  p_abort(comm_world, code);
  return NULL;
}

static napi_value module_init(napi_env env, napi_value exports) {
  napi_property_descriptor d[] = {
      {"load", NULL, js_load, NULL, NULL, NULL, napi_default, NULL},
      {"init", NULL, js_init, NULL, NULL, NULL, napi_default, NULL},
      {"bcast", NULL, js_bcast, NULL, NULL, NULL, napi_default, NULL},
      {"allgather", NULL, js_allgather, NULL, NULL, NULL, napi_default, NULL},
      {"reduceScatterSum", NULL, js_reduce_scatter, NULL, NULL, NULL, napi_default, NULL},
      {"barrier", NULL, js_barrier, NULL, NULL, NULL, napi_default, NULL},
      {"finalize", NULL, js_finalize, NULL, NULL, NULL, napi_default, NULL},
      {"abort", NULL, js_abort, NULL, NULL, NULL, napi_default, NULL},
  };
  napi_define_properties(env, exports, sizeof d / sizeof d[0], d);
  return exports;
}

NAPI_MODULE(NODE_GYP_MODULE_NAME, module_init)
