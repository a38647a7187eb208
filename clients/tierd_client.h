/* The C interface to tierd's client shim, for trainers not written in C++.
 *
 *   tierd_client* c = NULL;
 *   if (tierd_connect("/tmp/tierd", "rank0", 8ull << 30, 32ull << 30, 0, &c) != 0) ...
 *   uint64_t w;
 *   int64_t shape[2] = {4096, 4096};
 *   tierd_lease(c, "layers.0.w", TIERD_CLASS_PARAM, TIERD_DTYPE_BF16, shape, 2, &w, NULL);
 *   void* p;
 *   tierd_acquire(c, w, TIERD_ACCESS_WRITE, TIERD_PLACE_GPU, &p);
 *   ...
 *   tierd_release(c, w);
 *   tierd_close(c);
 *
 * Every call returns 0 on success or an absl::StatusCode / gRPC code (3 invalid argument,
 * 5 not found, 8 resource exhausted, 9 failed precondition, ...); tierd_last_error() then
 * says why, in words. Not thread-safe per client: use one client per thread, or lock.
 */
#ifndef TIERD_CLIENTS_TIERD_CLIENT_H_
#define TIERD_CLIENTS_TIERD_CLIENT_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tierd_client tierd_client;

enum { TIERD_CLASS_PARAM = 0, TIERD_CLASS_GRAD, TIERD_CLASS_OPT_STATE, TIERD_CLASS_ACTIVATION, TIERD_CLASS_SCRATCH };
enum { TIERD_DTYPE_F32 = 0, TIERD_DTYPE_BF16, TIERD_DTYPE_F16, TIERD_DTYPE_F8E4M3, TIERD_DTYPE_F8E5M2,
       TIERD_DTYPE_I32, TIERD_DTYPE_I64, TIERD_DTYPE_U8 };
/* OVERWRITE: every byte will be written without being read, so nothing is fetched. */
enum { TIERD_ACCESS_READ = 0, TIERD_ACCESS_WRITE = 1, TIERD_ACCESS_OVERWRITE = 2 };
enum { TIERD_PLACE_GPU = 0, TIERD_PLACE_HOST = 1 };
enum { TIERD_TIER_GPU = 0, TIERD_TIER_DRAM = 1, TIERD_TIER_NVME = 2 };

/* Quotas of 0, 0, 0 take the daemon's default. On failure *out is a client that holds
 * only the error (read it with tierd_last_error, then tierd_close it), or NULL. */
int tierd_connect(const char* runtime_dir, const char* label, uint64_t gpu_bytes, uint64_t dram_bytes,
                  uint64_t nvme_bytes, tierd_client** out);
int tierd_lease(tierd_client* client, const char* name, int tensor_class, int dtype, const int64_t* shape,
                int rank, uint64_t* tensor, uint64_t* bytes);
int tierd_unlease(tierd_client* client, uint64_t tensor);
int tierd_acquire(tierd_client* client, uint64_t tensor, int access, int place, void** pointer);
int tierd_release(tierd_client* client, uint64_t tensor);
int tierd_pin(tierd_client* client, uint64_t tensor, int tier);
int tierd_unpin(tierd_client* client, uint64_t tensor);
/* Call at the start of every iteration: tierd records the first one (its acquires and
 * releases) and moves tensors ahead of the ops of the following ones. */
int tierd_mark_iteration(tierd_client* client);
/* After each training step: its number (from 1), loss (NaN: a skipped step), seconds and
 * tokens; `tierctl stats` and Prometheus show the session's step time and loss variance. */
int tierd_report_step(tierd_client* client, int64_t step, double loss, double seconds, double tokens);
/* The message of the last failed call on this client ("" after a success). */
const char* tierd_last_error(const tierd_client* client);
void tierd_close(tierd_client* client);

#ifdef __cplusplus
}
#endif

#endif /* TIERD_CLIENTS_TIERD_CLIENT_H_ */
