/* strata.h: the stable C ABI of Strata, for trainers that embed it as their memory backend.
 *
 * Everything is reached through opaque handles (strata_comm, strata_engine) and functions that return a
 * strata_status: STRATA_OK (0) or an error code, with a message in strata_last_error() on the calling
 * thread. Nothing here aborts the process or throws, except strata_comm_abort, whose job that is.
 *
 * Protocol (docs/embedding.md walks through it with the guarantees). Every rank, same order:
 *   strata_comm_create_*                                    collective
 *   strata_engine_create                                    collective
 *   strata_engine_register_unit(...) for every unit; strata_engine_finalize   (collective)
 *   per step, for each of gradient_accumulation_steps micro-batches:
 *     strata_engine_begin_micro_batch
 *       strata_engine_begin_forward(u, &bufs) ... read bufs.params ... strata_engine_end_forward(u)
 *       strata_engine_begin_backward(u, &bufs) ... read params, ADD into bufs.grads ... strata_engine_end_backward(u)
 *     strata_engine_end_micro_batch
 *   strata_engine_step                                      collective
 *   strata_engine_destroy; strata_comm_destroy
 *
 * Versioned structs. Every struct passed across the ABI starts with {struct_size, version}. Initialise it
 * with its STRATA_*_INIT macro, which fills both and the defaults; then set fields by name. A struct only
 * ever grows at its end. The library reads an input struct up to its struct_size (fields an older caller
 * lacks keep their defaults; trailing bytes a newer caller set and this library does not know must be
 * zero, else STRATA_ERR_VERSION). It writes an output struct up to min(struct_size, its own size) and sets
 * `version` to the lower of the caller's and its own, which tells the caller which fields were written.
 *
 * Threading. strata_last_error() is per thread. A communicator and the engines created on it are driven
 * from one thread at a time (the trainer's hook thread); distinct communicators, with their engines, may
 * be used concurrently from distinct threads (as the ranks of an in-process group must be). Collective
 * calls (marked so) must be made by every rank of the communicator in the same order.
 *
 * Pointer lifetimes are stated at each function. Strings passed in are copied before the call returns.
 *
 * This header compiles as C99 and as C++ (C++11 or later) and includes only <stddef.h> and <stdint.h>.
 */
#ifndef STRATA_CAPI_STRATA_H_
#define STRATA_CAPI_STRATA_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The ABI version of this header: the soname is libstrata.so.<STRATA_ABI_VERSION>. Compatible additions
 * (new functions, fields appended to structs) keep it; anything else bumps it. */
#define STRATA_ABI_VERSION 1

/* ---- Status codes and errors ---- */

typedef int32_t strata_status;
enum strata_status_code {
  STRATA_OK = 0,
  STRATA_ERR_INVALID_ARGUMENT = 1,    /* a NULL handle or pointer, bad JSON config, bad parameter spec, wrong count */
  STRATA_ERR_FAILED_PRECONDITION = 2, /* a call out of order (a unit used before finalize, end without begin, ...),
                                         or an engine that refuses work after an earlier failure */
  STRATA_ERR_OUT_OF_RANGE = 3,        /* a unit or parameter id that does not exist */
  STRATA_ERR_RESOURCE_EXHAUSTED = 4,  /* a memory budget or the gathered-buffer pool (strata.max_live_units) */
  STRATA_ERR_DEADLINE_EXCEEDED = 5,   /* a collective timed out: a peer is dead, stuck or issued other calls */
  STRATA_ERR_UNIMPLEMENTED = 6,       /* not available in this build or not implemented yet (the message says) */
  STRATA_ERR_VERSION = 7,             /* a struct's struct_size / version is not one this library understands */
  STRATA_ERR_NOT_FOUND = 8,           /* a file or directory does not exist */
  STRATA_ERR_IO = 9,                  /* reading or writing a file failed, or its contents are damaged */
  STRATA_ERR_INTERNAL = 10,           /* anything else (a foreign call failed; the message names it) */
  STRATA_ERR_ALREADY_EXISTS = 11,     /* a checkpoint of that step is already complete */
  STRATA_ERR_PEER_FAILED = 12         /* another rank failed and will not join this call's collectives; the
                                         message names it and its cause (every rank's engine is then unusable) */
};

/* The message of the most recent strata_* call on this thread: "" when it succeeded (every function
 * except the four below sets or clears it). Never NULL; the pointer is the same for the thread's whole
 * life and its contents change with each call (messages beyond 4 KiB are truncated). */
const char* strata_last_error(void);
/* "STRATA_OK", "STRATA_ERR_INVALID_ARGUMENT", ...; "STRATA_ERR_UNKNOWN" for other values. Static storage. */
const char* strata_status_name(strata_status status);
/* The library's STRATA_ABI_VERSION (compare with the header's to detect a mismatched install). */
uint32_t strata_abi_version(void);
/* "0.1.0": the Strata release. Static storage. */
const char* strata_version_string(void);

/* ---- Enumerations ---- */

enum strata_dtype { STRATA_DTYPE_F32 = 0, STRATA_DTYPE_BF16 = 1, STRATA_DTYPE_F16 = 2 };
enum strata_device_kind { STRATA_DEVICE_HOST = 0, STRATA_DEVICE_CUDA = 1 };
/* Deterministic, world-size-independent initial values (generated by the engine at finalize). */
enum strata_init_kind {
  STRATA_INIT_ZEROS = 0,
  STRATA_INIT_ONES = 1,
  STRATA_INIT_CONSTANT = 2, /* init_value */
  STRATA_INIT_NORMAL = 3,   /* mean 0, std init_value */
  STRATA_INIT_UNIFORM = 4   /* in (-init_value, init_value) */
};

/* ---- Communicators ---- */

typedef struct strata_comm strata_comm;

/* Collective over MPI_COMM_WORLD. If MPI is not initialised yet, Strata initialises it (with
 * MPI_THREAD_MULTIPLE) and finalises it when the last communicator created this way is destroyed. If the
 * host initialised MPI itself, it must have asked for MPI_THREAD_MULTIPLE (else
 * STRATA_ERR_FAILED_PRECONDITION) and remains responsible for MPI_Finalize, after destroying every
 * strata communicator. STRATA_ERR_UNIMPLEMENTED in a build without MPI. */
strata_status strata_comm_create_mpi_world(strata_comm** out);

/* Collective over an existing MPI communicator of the host, passed as its Fortran handle
 * (MPI_Comm_c2f(comm)), so that this header need not include mpi.h: MPI_Comm is a pointer in Open MPI
 * and an int in MPICH, while MPI_Fint is an int in both. Strata duplicates the communicator; the host may
 * free its own afterwards. MPI must already be initialised with MPI_THREAD_MULTIPLE. */
strata_status strata_comm_create_mpi(int32_t mpi_comm_fortran_handle, strata_comm** out);

/* Over an existing ncclComm_t of the host (passed as void*), for engines with STRATA_DEVICE_CUDA.
 * Collective over that communicator's ranks: Strata splits it (ncclCommSplit) and keeps its own split, so
 * the host may go on using, and later destroy, its communicator. The host's CUDA device must be current on
 * the calling thread. STRATA_ERR_UNIMPLEMENTED in a build without CUDA and NCCL. */
strata_status strata_comm_create_nccl(void* nccl_comm, strata_comm** out);

/* Collective over a torchrun launch (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), for engines
 * with STRATA_DEVICE_CUDA; the bootstrap `strata train` uses under torchrun. Rank 0's NCCL id travels over
 * torchrun's own key-value store on MASTER_ADDR:MASTER_PORT (the agent's, TORCHELASTIC_USE_AGENT_STORE=True, or
 * the store of the job's torch.distributed rank 0): Strata listens on no port of its own (decision 0039). Then
 * NCCL initialises, nonblocking, on the calling thread's current CUDA device (set it to the rank's GPU, e.g.
 * LOCAL_RANK's, first). Each part is bounded by `timeout_ms` (<= 0: 60000): a rank that never arrives is
 * STRATA_ERR_DEADLINE_EXCEEDED naming the ranks missing. A rank that cannot join (no GPU visible, a rank started
 * twice, another WORLD_SIZE) fails every rank at once with STRATA_ERR_FAILED_PRECONDITION naming it.
 * STRATA_ERR_FAILED_PRECONDITION too when the process is no torchrun launch (WORLD_SIZE unset, or an MPI
 * launcher started it) or when the CUDA back-end module is absent. A malformed variable is
 * STRATA_ERR_INVALID_ARGUMENT naming it. STRATA_ERR_UNIMPLEMENTED in a build without CUDA and NCCL.
 * Unverified on a GPU (no session has had one to run it): the exchange and the missing-GPU error are
 * tested on a host. */
strata_status strata_comm_create_torchrun(int64_t timeout_ms, strata_comm** out);

/* Under a torchrun launch of more than one rank, starts the job watch over torchrun's store on
 * MASTER_ADDR:MASTER_PORT (decision 0039, "Failure notices across nodes"): when any rank of the job dies (a
 * signal, a non-zero exit status), every rank learns it within a fraction of a second. Strata's waits then fail
 * naming that rank, and a process still running 2 s after the notice prints it and exits with status 1, as
 * torchrun's agent stops the ranks of its own node. Once per process (later calls return OK); strata.torch calls it
 * when it is imported under torchrun's agent store, else when it binds its ranks (decision 0048), and
 * strata_comm_create_torchrun starts it itself. STRATA_ERR_OK, doing nothing, when the
 * process is no torchrun launch or the only rank; a store that does not answer within 30 s is
 * STRATA_ERR_DEADLINE_EXCEEDED naming it. Linux 5.3 or later (pidfd_open). It also tags the process's log lines
 * with its torchrun RANK ("[strata r3 W] ..."), as an MPI world's are. */
strata_status strata_comm_watch_torchrun(void);

/* `world_size` ranks as threads of this process (for tests and single-process use): fills
 * out_comms[0 .. world_size-1], one per rank. Each must be used from its own thread, since the collective
 * calls of the ranks rendezvous with each other. 1 <= world_size <= 2^20. */
strata_status strata_comm_create_in_process(int32_t world_size, strata_comm** out_comms);

/* A foreign communicator: collectives the trainer already owns (torch.distributed's process groups, or any
 * other), handed to Strata as callbacks over host buffers, for engines with STRATA_DEVICE_HOST. Strata runs its
 * collectives through them with its own deadlines and errors (docs/decisions/0033-foreign-communicators.md).
 *
 * Callbacks. Each returns STRATA_OK, or an error code with a NUL-terminated message written into
 * error[0 .. error_capacity) (Strata passes at least 1 KiB; "" is allowed). Return STRATA_ERR_DEADLINE_EXCEEDED
 * when the peers did not all arrive in time or a peer's connection was lost: Strata then runs its liveness
 * check and names the ranks that did not respond. Every rank calls the collectives of corresponding
 * communicators in the same order, with the same count, dtype and root. Buffers are host memory; `count` is
 * in elements of `dtype` (a strata_dtype); a call returns when this rank's part is done:
 *   all_gather      send: count elements; recv: size * count, rank r's block at r * count. In place when send
 *                   is recv's own block (send == recv + rank * count elements).
 *   reduce_scatter  send: size * count; recv: this rank's block of the element-wise SUM over ranks (recv does
 *                   not overlap send).
 *   all_reduce      the element-wise SUM of count elements into recv; in place when send == recv.
 *   broadcast       rank `root`'s count elements into every rank's buf.
 *   barrier         returns once every rank has called it.
 * A sum in BF16 or F16 adds in fp32 and rounds to the dtype after each addition. The order of a sum is the
 * trainer's choice: the same bits on every rank are required, and strata.torch's order (decision 0033) is
 * the MPI back-end's, so that a job gives the same results through either.
 *   dup             collective: a new foreign communicator over the same ranks, with its own ordering, into
 *                   *out (initialised by Strata with STRATA_FOREIGN_COMM_INIT); its collectives should give up
 *                   after `timeout_ms`.
 *   split           collective: colors[r] and keys[r] are every rank's (size of each, indexed by rank; every
 *                   color >= 0). A new foreign communicator over the ranks whose color is this rank's, ranked by
 *                   (key, rank), into *out; its collectives should give up after `timeout_ms`.
 *   destroy         frees `user`; called once, when Strata is done with the communicator (may be NULL).
 *   kv_set, kv_get  optional (both or neither): the job's key-value store, shared by every rank of every
 *                   communicator of the job (torch.distributed's Store). kv_get does not wait: *out_length is
 *                   the value's length, or -1 while the key is unset; at most `capacity` bytes are copied.
 *                   Strata uses keys under "strata/<job id>/" for failure notices (a rank that fails tells its
 *                   peers, whose waits then end at once naming it) and for the liveness check after a timeout.
 *                   Without them a timeout cannot name the ranks that did not respond, and peers learn of a
 *                   failure only at their deadline.
 *   abort           optional: ends the whole job from this rank (strata_comm_abort); may not return.
 * Threading. Strata calls a communicator's collectives, dup and split on a thread of its own for that
 * communicator (never the trainer's calling thread), one call at a time; the callbacks of distinct
 * communicators (a dup, a split) may run at the same time on distinct threads. kv_set and kv_get may be
 * called from any thread, also while a collective of the same communicator runs. A thread waits for each call
 * against the communicator's collective timeout: a call still running at the deadline (or when a peer's
 * failure notice arrived and it did not complete within 200 ms more) fails the collective with
 * STRATA_ERR_DEADLINE_EXCEEDED (or STRATA_ERR_PEER_FAILED), and the communicator refuses later calls; the call
 * may still use the collective's buffers until it returns, so the trainer's collectives should give up at
 * their timeout too. Such a communicator's `destroy` runs on Strata's thread when its call returns.
 * Ownership. On a successful dup or split Strata owns *out (and calls its destroy). */
typedef struct strata_foreign_comm {
  uint32_t struct_size;
  uint32_t version;
  void* user;   /* passed to every callback */
  int32_t rank; /* this rank in the trainer's communicator */
  int32_t size; /* its ranks, >= 1 */
  strata_status (*all_gather)(void* user, const void* send, void* recv, size_t count, int32_t dtype, char* error,
                              size_t error_capacity);
  strata_status (*reduce_scatter)(void* user, const void* send, void* recv, size_t count, int32_t dtype, char* error,
                                  size_t error_capacity);
  strata_status (*all_reduce)(void* user, const void* send, void* recv, size_t count, int32_t dtype, char* error,
                              size_t error_capacity);
  strata_status (*broadcast)(void* user, void* buf, size_t count, int32_t dtype, int32_t root, char* error,
                             size_t error_capacity);
  strata_status (*barrier)(void* user, char* error, size_t error_capacity);
  strata_status (*dup)(void* user, int64_t timeout_ms, struct strata_foreign_comm* out, char* error,
                       size_t error_capacity);
  strata_status (*split)(void* user, const int32_t* colors, const int32_t* keys, int64_t timeout_ms,
                         struct strata_foreign_comm* out, char* error, size_t error_capacity);
  void (*destroy)(void* user);
  strata_status (*kv_set)(void* user, const char* key, const void* value, size_t length, char* error,
                          size_t error_capacity);
  strata_status (*kv_get)(void* user, const char* key, void* value, size_t capacity, int64_t* out_length, char* error,
                          size_t error_capacity);
  void (*abort)(void* user, const char* reason);
} strata_foreign_comm;
#define STRATA_FOREIGN_COMM_INIT                                                                                  \
  { (uint32_t)sizeof(strata_foreign_comm), STRATA_ABI_VERSION, NULL, 0, 1, NULL, NULL, NULL, NULL, NULL, NULL, NULL, \
    NULL, NULL, NULL, NULL }

/* Collective over the trainer's communicator `foreign` (copied; Strata owns `foreign->user` from this call on,
 * whatever its result, and calls `destroy` when done with it; not after STRATA_ERR_VERSION or a NULL `foreign`).
 * Rank 0's random job id reaches every rank in a broadcast, then an all-gather checks every rank's number, both
 * bounded by `timeout_ms` (<= 0: 60000), as are the collectives of this communicator itself (an engine's own are
 * duplicates with its strata.collective_timeout_ms). STRATA_ERR_INVALID_ARGUMENT for a missing callback (all but
 * destroy, kv_* and abort are required), kv_set without kv_get, a rank outside [0, size), or ranks that do not
 * number the trainer's communicator (two ranks that say the same rank); STRATA_ERR_VERSION for a bad struct_size
 * or version. */
strata_status strata_comm_create_foreign(const strata_foreign_comm* foreign, int64_t timeout_ms, strata_comm** out);

/* Collective over `bootstrap`'s ranks, which must all run on this host: a communicator over one shared-memory
 * segment (docs/decisions/0053-shared-memory-host-transport.md), for engines with STRATA_DEVICE_HOST. `bootstrap`
 * (any host communicator: the foreign one over gloo under torchrun, MPI, in-process) carries only the set-up: the
 * ranks compare their hosts (boot id and host name), rank 0 creates the segment in /dev/shm, every rank maps it,
 * and its name is removed before this returns, so nothing is left behind if a rank dies. The result does not
 * refer to `bootstrap`, which may be destroyed afterwards. Its collectives give the same bits as the MPI
 * back-end's, and are bounded by `timeout_ms` (<= 0: 60000); a rank that does not arrive is named, as is one
 * whose process has exited. STRATA_ERR_FAILED_PRECONDITION on every rank when the ranks are not all on one host
 * (the message names them) or a rank cannot create or map the segment (say, /dev/shm too small: the message
 * names the rank); STRATA_ERR_INVALID_ARGUMENT for a device-buffer (NCCL) bootstrap. */
strata_status strata_comm_create_shm(strata_comm* bootstrap, int64_t timeout_ms, strata_comm** out);

strata_status strata_comm_rank(const strata_comm* comm, int32_t* out_rank);
strata_status strata_comm_size(const strata_comm* comm, int32_t* out_size);

/* Ends the whole job from this rank after an unrecoverable error (MPI_Abort), so that the other ranks
 * do not wait for a collective timeout. Does not return for MPI communicators; for in-process ones it
 * fails every later collective of the group and returns STRATA_OK. A foreign one sends its failure notice
 * (kv_set), calls its abort callback (which may not return) and then fails its own later collectives. */
strata_status strata_comm_abort(strata_comm* comm, const char* reason);

/* Destroys a communicator. STRATA_ERR_FAILED_PRECONDITION (and nothing is destroyed) while an engine
 * created on it is alive. NULL is a no-op returning STRATA_OK. */
strata_status strata_comm_destroy(strata_comm* comm);

/* ---- Engine creation and registration ---- */

typedef struct strata_engine strata_engine;

typedef struct strata_engine_options {
  uint32_t struct_size;
  uint32_t version;
  /* The engine configuration as a JSON document: DeepSpeed's keys (zero_optimization.stage, optimizer,
   * scheduler, bf16, fp16, gradient_clipping, gradient_accumulation_steps, ...) plus a "strata" object.
   * NULL or "" means all defaults. An unknown key is an error naming the nearest valid one. */
  const char* config_json;
  /* strata_device_kind. STRATA_DEVICE_CUDA: the state and the pointers the hooks return (parameters,
   * gradients) are in the memory of the calling thread's current CUDA device; collectives run on NCCL
   * (bootstrapped over an MPI or in-process comm, or the comm from strata_comm_create_nccl). Parameter
   * offload is refused there; optimizer offload needs stage 2 or 3. The host's GPU work that reads a
   * unit's parameters or writes its gradients must be complete (e.g. cudaStreamSynchronize on its stream)
   * before strata_engine_end_forward / end_backward: the engine may then reuse the gathered buffer or
   * start reducing the gradients on its own streams. STRATA_ERR_FAILED_PRECONDITION when no GPU is
   * visible, STRATA_ERR_UNIMPLEMENTED in a build without CUDA. */
  int32_t device;
  /* Appended (a caller built before it passes the smaller struct_size and gets 0): */
  int32_t reserved;     /* 0 (keeps the struct free of padding) */
  int64_t hidden_size;  /* the model's hidden size, 0 if unknown: a config's "auto" ZeRO bucket sizes are
                           resolved from it as Hugging Face's integration does (hidden^2, ...) */
} strata_engine_options;
#define STRATA_ENGINE_OPTIONS_INIT \
  { (uint32_t)sizeof(strata_engine_options), STRATA_ABI_VERSION, NULL, STRATA_DEVICE_HOST, 0, 0 }

/* Collective: duplicates `comm` into one communicator per internal stream. `options` may be NULL
 * (defaults). `comm` must outlive the engine (strata_comm_destroy refuses otherwise). */
strata_status strata_engine_create(strata_comm* comm, const strata_engine_options* options, strata_engine** out);

typedef struct strata_param_spec {
  uint32_t struct_size;
  uint32_t version;
  const char* name;     /* unique within the unit, non-empty */
  const int64_t* shape; /* ndim positive extents */
  int32_t ndim;         /* 1 .. 64 */
  int32_t weight_decay; /* nonzero: AdamW weight decay applies */
  int32_t init;         /* strata_init_kind */
  float init_value;     /* see strata_init_kind; finite where it is used */
  /* Appended (a caller built before it passes the smaller struct_size and gets 0): */
  int32_t frozen;       /* nonzero: frozen (fine-tuning, adapters): gathered and checkpointed, never reduced
                           or updated, no gradient or optimizer memory; begin_backward gives grads = NULL.
                           A unit's parameters are all frozen or all trainable: register them as two units */
  int32_t reserved;     /* 0 (keeps the struct free of padding, whose bytes an older library checks) */
  /* Appended (a caller built before them passes the smaller struct_size and gets the config's values): the
   * parameter's own hyper-parameters, a torch param group's, in place of the config's optimizer.params.lr /
   * weight_decay (docs/decisions/0032-param-groups.md). Each is used when its has_ flag is nonzero; the
   * values must then be finite and >= 0. The lr follows the config's scheduler as DeepSpeed's schedules
   * treat a param group's lr: as is without a scheduler, times the ratio under WarmupCosineLR, as the peak
   * under WarmupLR without warmup_max_lr; WarmupDecayLR and WarmupLR given warmup_max_lr use that one peak
   * for every parameter (the library logs once which own lrs that leaves unused). The weight decay is the
   * decay of a parameter whose weight_decay is nonzero (one that does not decay cannot have its own), under
   * the optimizer's rule (AdamW decoupled; Adam with adam_w_mode false: L2; SGD: L2). Checkpoints record both,
   * and a load refuses a parameter whose values differ from the saved ones. */
  int32_t has_own_lr;
  int32_t has_own_weight_decay;
  double own_lr;
  double own_weight_decay;
} strata_param_spec;
#define STRATA_PARAM_SPEC_INIT                                                                                  \
  { (uint32_t)sizeof(strata_param_spec), STRATA_ABI_VERSION, NULL, NULL, 0, 0, STRATA_INIT_ZEROS, 0.0f, 0, 0, 0, 0, \
    0.0, 0.0 }

/* Before finalize. Registers a unit (typically a layer) whose `num_params` parameters are packed, in
 * this order, into one flat buffer. The array's stride is params[0].struct_size (every element must
 * carry the same). Unit ids are 0, 1, ... in registration order; *out_unit may be NULL. Every rank must
 * register the same units in the same order (finalize checks it). */
strata_status strata_engine_register_unit(strata_engine* engine, const char* name, const strata_param_spec* params,
                                          int32_t num_params, int32_t* out_unit);

/* Collective. Checks that every rank registered the same units, allocates all state and initialises
 * the parameters. After it, no unit can be registered. */
strata_status strata_engine_finalize(strata_engine* engine);

strata_status strata_engine_num_units(const strata_engine* engine, int32_t* out);
strata_status strata_engine_num_params(const strata_engine* engine, int32_t unit, int32_t* out);

typedef struct strata_param_info {
  uint32_t struct_size;
  uint32_t version;
  const char* name;     /* valid until the engine is destroyed */
  const int64_t* shape; /* ndim extents; valid until the engine is destroyed */
  uint64_t numel;
  uint64_t offset_elems; /* start in the unit's flat buffer */
  int32_t ndim;
  int32_t dtype;        /* strata_dtype of the gathered parameters (the gradients are always fp32) */
  int32_t weight_decay;
} strata_param_info;
#define STRATA_PARAM_INFO_INIT \
  { (uint32_t)sizeof(strata_param_info), STRATA_ABI_VERSION, NULL, NULL, 0, 0, 0, 0, 0 }

/* After register_unit. */
strata_status strata_engine_param_info(const strata_engine* engine, int32_t unit, int32_t param,
                                       strata_param_info* out);

/* ---- The per-step hooks (after finalize, from the engine's hook thread) ---- */

strata_status strata_engine_begin_micro_batch(strata_engine* engine);
/* Checks that every unit begun was ended and that every forward use had its backward use. */
strata_status strata_engine_end_micro_batch(strata_engine* engine);

typedef struct strata_unit_buffers {
  uint32_t struct_size;
  uint32_t version;
  int32_t num_params;
  int32_t param_dtype;     /* strata_dtype: F32 floats, or BF16 / F16 bit patterns (uint16_t) */
  void* const* params;     /* [num_params]: the gathered parameters, in registration order */
  float* const* grads;     /* [num_params]: fp32 gradient buffers (backward); NULL after begin_forward;
                              each NULL for a frozen unit (strata_param_spec.frozen), which has none */
} strata_unit_buffers;
#define STRATA_UNIT_BUFFERS_INIT \
  { (uint32_t)sizeof(strata_unit_buffers), STRATA_ABI_VERSION, 0, 0, NULL, NULL }

/* Gathers unit `unit` (waiting for its all-gather if the prefetch has not finished it) and fills *out
 * (which may be NULL; strata_engine_param gives the same pointers). Inside a micro-batch the use is
 * recorded; the first micro-batch's order of uses must be repeated by later ones (it drives prefetch).
 * Outside a micro-batch this is evaluation: nothing is recorded and no backward may follow.
 * Lifetime: the parameter pointers, and the arrays holding them, are valid until the matching
 * strata_engine_end_forward returns. The trainer must not write to the parameters. */
strata_status strata_engine_begin_forward(strata_engine* engine, int32_t unit, strata_unit_buffers* out);
/* After it the parameter pointers of this use are invalid: the buffer may be released or reused. */
strata_status strata_engine_end_forward(strata_engine* engine, int32_t unit);

/* Inside a micro-batch, once per forward use, in reverse order of the forward uses. Fills parameters and
 * gradients. The gradient buffers are zero at the unit's first backward use in the micro-batch (stages
 * 2-3) or step (stages 0-1); the trainer ADDS (+=) the gradient of the micro-batch's mean loss, so a unit
 * used several times (tied weights) accumulates correctly. The engine averages over ranks and
 * micro-batches. Lifetime: all pointers valid until the matching strata_engine_end_backward returns. */
strata_status strata_engine_begin_backward(strata_engine* engine, int32_t unit, strata_unit_buffers* out);
/* At the unit's last backward use, starts the reduction of its gradients (asynchronous). */
strata_status strata_engine_end_backward(strata_engine* engine, int32_t unit);
/* Inside a micro-batch: this rank wrote no gradient to `param` of `unit` in it (torch's .grad of None).
 * With the config key strata.params_without_grad = "skip", a parameter that no rank wrote a gradient to in
 * any micro-batch of a step is not updated by that step (no weight decay, its optimizer state untouched, its
 * own step count not advanced), as torch.optim does; with "zero" (the default, DeepSpeed's rule) it is
 * updated with a zero gradient and the mark changes nothing. A unit with no backward use needs no marks. */
strata_status strata_engine_mark_no_grad(strata_engine* engine, int32_t unit, int32_t param);

/* The same pointers as in strata_unit_buffers, one at a time; valid for the same period. param: while
 * the unit is between a begin and its end; grad: between begin_backward and end_backward.
 * STRATA_ERR_FAILED_PRECONDITION outside those periods, and grad of a frozen unit. */
strata_status strata_engine_param(const strata_engine* engine, int32_t unit, int32_t param, void** out);
strata_status strata_engine_grad(const strata_engine* engine, int32_t unit, int32_t param, float** out);

/* The engine zeroes all gradients itself at the end of every strata_engine_step (and they start at zero),
 * so a trainer's zero_grad() maps to this check: STRATA_OK when no micro-batch of the current step has
 * started (the gradients are zero), STRATA_ERR_FAILED_PRECONDITION once one has (accumulated gradients
 * cannot be discarded: they are already partly reduced across ranks). */
strata_status strata_engine_zero_grad(strata_engine* engine);

typedef struct strata_step_result {
  uint32_t struct_size;
  uint32_t version;
  int64_t step;       /* updates applied so far, after this call */
  int32_t skipped;    /* nonzero: a non-finite gradient; nothing was updated, on any rank */
  float clip_coef;    /* gradient clipping factor applied (1 = none) */
  double grad_norm;   /* global gradient norm before clipping */
  double lr;          /* learning rate used by this step */
  double loss_scale;  /* the factor to multiply the loss gradient by from now on (fp16; 1 otherwise) */
} strata_step_result;
#define STRATA_STEP_RESULT_INIT \
  { (uint32_t)sizeof(strata_step_result), STRATA_ABI_VERSION, 0, 0, 0.0f, 0.0, 0.0, 0.0 }

/* Collective, blocking. After gradient_accumulation_steps micro-batches: waits for the gradient
 * reductions, computes the global norm, clips, updates this rank's shards, re-publishes the parameters and
 * zeroes the gradients. `out` may be NULL. A failure leaves the engine refusing further hooks. */
strata_status strata_engine_step(strata_engine* engine, strata_step_result* out);

/* The loss scale the next micro-batches should use (fp16 dynamic loss scaling; 1 otherwise). */
strata_status strata_engine_loss_scale(const strata_engine* engine, float* out);

/* The learning rate the next strata_engine_step will use (the config's `scheduler` at the current step) for
 * the parameters without an lr of their own (strata_param_spec.has_own_lr 0): what that step's
 * strata_step_result.lr will say. */
strata_status strata_engine_lr(const strata_engine* engine, double* out);
/* The same for a parameter registered with has_own_lr / own_lr (strata_param_spec): the lr the next step
 * gives it under the config's scheduler. has_own_lr 0 is strata_engine_lr. own_lr must then be finite and
 * >= 0 (STRATA_ERR_INVALID_ARGUMENT). */
strata_status strata_engine_group_lr(const strata_engine* engine, int32_t has_own_lr, double own_lr, double* out);

/* The configuration the engine runs, resolved (the batch sizes derived, "auto" filled in, the defaults of
 * absent keys): a JSON object from key path to its value as text, e.g. {"gradient_accumulation_steps": "4",
 * "strata.weight_decay_1d": "true", ...}. *out is owned by the engine and valid until it is destroyed. */
strata_status strata_engine_config_json(const strata_engine* engine, const char** out);

/* Collective, blocking, after finalize: the full fp32 master value of one parameter, `count` (= numel)
 * floats into caller memory. For export, checksums and tests. */
strata_status strata_engine_gather_param(strata_engine* engine, int32_t unit, int32_t param, float* out,
                                         size_t count);
/* After finalize, outside micro-batches: overwrites one parameter with a full fp32 value (every rank passes
 * the same `count` = numel floats, all finite). Not collective. */
strata_status strata_engine_set_param(strata_engine* engine, int32_t unit, int32_t param, const float* values,
                                      size_t count);

/* Collective, blocking, after finalize, between steps: the full fp32 master of one unit's parameters at once,
 * one gather for all of them: `count` floats into caller memory, the unit's flat buffer from element 0 up to
 * the end of its last parameter (max of offset_elems + numel; each parameter at its offset_elems). For
 * export, a unit at a time. */
strata_status strata_engine_gather_unit(strata_engine* engine, int32_t unit, float* out, size_t count);
/* After finalize: the elements [*begin, *end) of unit `unit`'s flat buffer (offset_elems counts in it) whose
 * values this rank keeps, its part of the fp32 master and of the parameter storage: about 1/world_size of
 * the unit at stage 3, all of it at stages 0-2 (the parameters are replicated). *begin == *end when it keeps
 * none. A loader reads only these elements from a checkpoint (strata_engine_set_param_range). Not collective. */
strata_status strata_engine_held_range(const strata_engine* engine, int32_t unit, uint64_t* begin, uint64_t* end);
/* After finalize, outside micro-batches: overwrites elements [offset, offset + count) of one parameter with
 * fp32 values (all finite). Elements outside this rank's held range are ignored, so each rank may pass only
 * the part it keeps. Not collective. strata_engine_set_param is this with offset 0 and the whole parameter. */
strata_status strata_engine_set_param_range(strata_engine* engine, int32_t unit, int32_t param, uint64_t offset,
                                            const float* values, size_t count);

/* ---- Checkpoints ---- */

/* Collective, between steps (after strata_engine_step, or before the first micro-batch). Writes the state
 * after the last step (fp32 master weights, optimizer state, step, loss-scale state) as a sharded
 * checkpoint into <root_dir>/step_<8-digit step> (the layout `strata train` and `strata ckpt` use): one
 * shard file per rank, then the manifest, written last by rank 0; each file goes to a temporary name, is
 * fsynced and renamed, so an interrupted save never publishes a partial checkpoint. `trainer_json` is
 * the trainer's own state (data position, ...), a JSON document stored in the manifest; NULL means "{}".
 * STRATA_ERR_ALREADY_EXISTS when that step's checkpoint is already complete. */
strata_status strata_engine_save_checkpoint(strata_engine* engine, const char* root_dir, const char* trainer_json);

/* Collective, like strata_engine_save_checkpoint and the same files byte for byte, but asynchronous
 * (docs/decisions/0036-async-checkpoints.md): returns once this rank's shard of the state is copied into host
 * memory; a background thread writes, fsyncs and publishes it (manifest last) while training goes on. One
 * save in flight: a save or load first waits for it. A failure of the background write, naming the step
 * directory, is returned by the next strata_engine_step that finds it finished (that step is then not taken:
 * call it again), by the next save (which then does not start), or by strata_engine_wait_checkpoint.
 * Destroying the engine waits for the save in flight. Costs this rank's shard of master weights and
 * optimizer state in host memory until its file is written, except the state on NVMe (offload_optimizer
 * nvme), which the save holds on NVMe without a copy (docs/decisions/0046-async-checkpoints-of-nvme-state.md). */
strata_status strata_engine_save_checkpoint_async(strata_engine* engine, const char* root_dir,
                                                  const char* trainer_json);
/* Collective. Waits for the asynchronous save in flight and returns the last one's outcome (STRATA_OK when
 * there was none). */
strata_status strata_engine_wait_checkpoint(strata_engine* engine);
/* Not collective. *out = 1 while an asynchronous save is being written on this rank, else 0. A save whose NVMe
 * tiles were cloned stays in flight until the next step's reads checked them, at most 2 minutes (decision 0058). */
strata_status strata_engine_checkpoint_in_flight(const strata_engine* engine, int32_t* out);

/* Collective, before training or between steps. `dir` is a step directory, or a root directory whose
 * latest complete step is loaded. Accepts a checkpoint written at any world size and ZeRO stage (it
 * reshards by global offsets) and verifies every checksum it reads; errors name the file and the problem
 * (another model, param dtype or optimizer, a missing, truncated or corrupted file). Restores the
 * parameters, optimizer state, step count and loss scale, and zeroes the gradients. *out_trainer_json
 * (may be NULL) receives the trainer state saved with it: a string owned by the engine, valid until the
 * next load or the engine's destruction. */
strata_status strata_engine_load_checkpoint(strata_engine* engine, const char* dir, const char** out_trainer_json);

/* ---- Pretrained weights (Hugging Face safetensors) ----
 * docs/decisions/0037-pretrained-by-byte-ranges.md. A checkpoint is one .safetensors file, or a directory
 * holding model.safetensors, or model.safetensors.index.json and the files its weight_map names (what
 * transformers' save_pretrained writes). Every file is untrusted input: the index (at most 100 MB, JSON
 * without repeated keys, a weight_map of tensor names to plain file names in the directory) and every header
 * (length, JSON, dtypes, shapes of at most 64 dimensions, data_offsets holding exactly each tensor's bytes, the
 * tensors tiling the data) are validated before any tensor data is read; a tensor in two files, or in a file
 * the index does not name for it, and an index entry its file lacks are errors. Messages name the file and
 * the tensor. Nothing here is collective. */

typedef struct strata_safetensors strata_safetensors;

/* Opens and validates `path` (see above); the files stay open until strata_safetensors_close.
 * STRATA_ERR_NOT_FOUND: no such path or file, or a directory with neither file; STRATA_ERR_IO: a damaged one. */
strata_status strata_safetensors_open(const char* path, strata_safetensors** out);
/* NULL is a no-op returning STRATA_OK. */
strata_status strata_safetensors_close(strata_safetensors* checkpoint);
/* The number of tensors, over all files. */
strata_status strata_safetensors_num_tensors(const strata_safetensors* checkpoint, size_t* out);

typedef struct strata_safetensors_tensor {
  uint32_t struct_size;
  uint32_t version;
  const char* name;  /* the pointers are the handle's, valid until it is closed */
  const char* dtype; /* "F32", "BF16", "F16", "I64", ... */
  const int64_t* shape;
  int32_t ndim;
  int32_t reserved;
  uint64_t data_begin; /* its bytes [data_begin, data_end) in its file's data section */
  uint64_t data_end;
  const char* file;         /* the file's path */
  uint64_t file_data_bytes; /* the size of that file's data section */
} strata_safetensors_tensor;
#define STRATA_SAFETENSORS_TENSOR_INIT \
  { (uint32_t)sizeof(strata_safetensors_tensor), STRATA_ABI_VERSION, NULL, NULL, NULL, 0, 0, 0, 0, NULL, 0 }

/* Tensor `index` (< num_tensors; sorted by name). */
strata_status strata_safetensors_tensor_info(const strata_safetensors* checkpoint, size_t index,
                                             strata_safetensors_tensor* out);
/* Bytes [offset, offset + bytes) of tensor `index`'s data, as stored (its dtype, little-endian), into `out`
 * (pread): for small tensors read whole, such as buffers. STRATA_ERR_OUT_OF_RANGE beyond the tensor,
 * STRATA_ERR_IO when the file was shortened since it was opened. */
strata_status strata_safetensors_read(const strata_safetensors* checkpoint, size_t index, uint64_t offset, void* out,
                                      size_t bytes);

typedef struct strata_load_options {
  uint32_t struct_size;
  uint32_t version;
  int32_t io_backend;       /* 0: auto (io_uring when built and allowed, else a pread thread pool), 1: io_uring
                               (STRATA_ERR_UNIMPLEMENTED when unavailable), 2: the thread pool. STRATA_IO_BACKEND
                               overrides auto. */
  uint32_t io_depth;        /* requests in flight; 0: 32 */
  uint64_t staging_bytes;   /* per staging buffer (registered with io_uring); 0: 8 MiB */
  uint32_t staging_buffers; /* buffers in flight; 0: 4 */
  uint32_t reserved;
} strata_load_options;
#define STRATA_LOAD_OPTIONS_INIT \
  { (uint32_t)sizeof(strata_load_options), STRATA_ABI_VERSION, 0, 0, 0, 0, 0 }

typedef struct strata_load_stats {
  uint32_t struct_size;
  uint32_t version;
  uint64_t bytes_read;       /* bytes this rank read from the files: exactly its held elements' bytes */
  uint64_t requests;         /* read requests */
  uint64_t fixed_buffer_ios; /* of them, io_uring READ_FIXED on the registered staging buffers */
  uint64_t elements;         /* elements written into the engine */
  double seconds;
  char backend[64]; /* the reader's description, NUL-terminated ("io_uring depth=32 ...", "threads ...") */
  /* Bytes the engine's NVMe offload (parameter shards, optimizer state) wrote and read during the load: each
   * unit's master and parameter shard are written once (0 without NVMe offload). */
  uint64_t nvme_bytes_written;
  uint64_t nvme_bytes_read;
} strata_load_stats;
#define STRATA_LOAD_STATS_INIT \
  { (uint32_t)sizeof(strata_load_stats), STRATA_ABI_VERSION, 0, 0, 0, 0, 0.0, {0}, 0, 0 }

/* After finalize, outside micro-batches; not collective. For i < count, parameter (units[i], params[i])
 * takes tensor tensors[i] of `checkpoint`: this rank reads only the elements of it that it keeps
 * (strata_engine_held_range), by their byte ranges, through the offload layer's reader (io_uring with
 * registered staging buffers, or its pread thread pool), converts F32, BF16 and F16 to fp32 and writes them as
 * strata_engine_set_param_range does, one unit at a time (each unit's master and parameter shard written
 * once). Refused before any I/O (STRATA_ERR_INVALID_ARGUMENT / STRATA_ERR_OUT_OF_RANGE): a unit, parameter or
 * tensor that does not exist, a tensor whose element count is not the parameter's, another dtype. A value that
 * is not finite, or a read that fails, is an error naming the file and the tensor; units written before it keep
 * their new values, the unit being read its old ones. `options` may be NULL (defaults); `out` may be NULL. */
strata_status strata_engine_load_safetensors(strata_engine* engine, const strata_safetensors* checkpoint,
                                             const int32_t* units, const int32_t* params, const uint64_t* tensors,
                                             size_t count, const strata_load_options* options, strata_load_stats* out);

/* As strata_engine_load_safetensors, for a parameter the checkpoint stores as several tensors (transformers'
 * stacked experts: one checkpoint tensor per expert): tensor tensors[i] fills the elements [at[i], at[i] + its
 * element count) of parameter (units[i], params[i]); a tensor that would reach past the parameter's end is
 * refused (STRATA_ERR_INVALID_ARGUMENT) before any I/O. Which elements each parameter takes from which tensor is
 * the caller's: the pieces of one parameter should tile it. */
strata_status strata_engine_load_safetensors_at(strata_engine* engine, const strata_safetensors* checkpoint,
                                                const int32_t* units, const int32_t* params, const uint64_t* tensors,
                                                const uint64_t* at, size_t count, const strata_load_options* options,
                                                strata_load_stats* out);

/* ---- Stats ---- */

typedef struct strata_stats {
  uint32_t struct_size;
  uint32_t version;
  /* Bytes held per memory tier, as accounted by the runtime itself (on a host-only build the "device"
   * tier is host memory under its own budget). Peaks since finalize or strata_engine_reset_peak_memory. */
  uint64_t device_current_bytes;
  uint64_t device_peak_bytes;
  uint64_t pinned_host_current_bytes;
  uint64_t pinned_host_peak_bytes;
  uint64_t nvme_current_bytes;
  uint64_t nvme_peak_bytes;
  int64_t steps;       /* updates applied */
  double loss_scale;
  /* Time split of the last completed step, in milliseconds, as the engine measures it on the hook thread
   * (the numbers `strata train` reports). step: wall time from the return of the previous
   * strata_engine_step (or the first begin of the first step) to the return of this one. compute: between
   * a unit's begin returning and its end being called, summed over uses. exposed_comm: the hook thread
   * blocked on collectives (gathers not yet arrived, gradient reductions, the step's collectives).
   * exposed_io: blocked on offload I/O (0 while the engine has no offload tier). optimizer: the update
   * itself. other: the rest (data loading, loss, logging, bookkeeping), so that the parts sum to step
   * unless nested uses of units overlap. All 0 before the first step. */
  double last_step_ms;
  double last_compute_ms;
  double last_exposed_comm_ms;
  double last_exposed_io_ms;
  double last_optimizer_ms;
  double last_other_ms;
} strata_stats;
#define STRATA_STATS_INIT \
  { (uint32_t)sizeof(strata_stats), STRATA_ABI_VERSION, 0, 0, 0, 0, 0, 0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0 }

strata_status strata_engine_get_stats(const strata_engine* engine, strata_stats* out);
/* Peaks := current bytes. */
strata_status strata_engine_reset_peak_memory(strata_engine* engine);

/* ---- Trace ----
 * A Chrome trace (chrome://tracing, ui.perfetto.dev) of the engine's work: the file `strata train --trace`
 * writes, from the same runtime code. Per rank (a process) and stream (a thread): each gather, each unit's
 * forward and backward use, each gradient reduction and optimizer step, plus every tier's bytes after each
 * step. At most 500,000 events per rank are kept (the first ones). */

/* on != 0 starts recording (dropping what an earlier recording kept); 0 stops. After finalize, between
 * steps. Not collective. */
strata_status strata_engine_trace_enable(strata_engine* engine, int32_t on);
/* Collective: every rank calls it, after finalize and between steps; rank 0 writes one file holding every
 * rank's events on one time axis to `path` (other ranks ignore it; it may be NULL there). Needs a host
 * communicator (MPI or in-process): STRATA_ERR_FAILED_PRECONDITION on a communicator of device buffers
 * (NCCL). The ranks first agree that all can take part: when one cannot (not recording, inside a step, rank
 * 0 without a path or unable to open it), every rank returns an error at once and nothing is written.
 * Recording, if on, goes on. */
strata_status strata_engine_write_trace(strata_engine* engine, const char* path);

/* Drains the engine's streams and frees everything it holds. Every pointer it returned becomes invalid.
 * Not collective. NULL is a no-op returning STRATA_OK. */
strata_status strata_engine_destroy(strata_engine* engine);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* STRATA_CAPI_STRATA_H_ */
