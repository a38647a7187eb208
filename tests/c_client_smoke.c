/* The C interface used from plain C (compiled as C): lease, write, read back, errors.
 *   c_client_smoke RUNTIME_DIR   prints "c client ok" and exits 0 */
#include <stdio.h>
#include <string.h>

#include "clients/tierd_client.h"

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  tierd_client* c = NULL;
  if (tierd_connect(argv[1], "c-smoke", 1 << 20, 1 << 20, 0, &c) != 0) {
    fprintf(stderr, "connect: %s\n", tierd_last_error(c));
    tierd_close(c);
    return 1;
  }
  const int64_t shape[2] = {16, 64};
  uint64_t t = 0, bytes = 0;
  if (tierd_lease(c, "c.w", TIERD_CLASS_PARAM, TIERD_DTYPE_F32, shape, 2, &t, &bytes) != 0 || bytes != 4096) return 1;
  void* p = NULL;
  if (tierd_mark_iteration(c) != 0) return 1; /* records from here... */
  if (tierd_acquire(c, t, TIERD_ACCESS_WRITE, TIERD_PLACE_HOST, &p) != 0) return 1;
  memset(p, 0x5A, bytes);
  if (tierd_release(c, t) != 0) return 1;
  if (tierd_acquire(c, t, TIERD_ACCESS_READ, TIERD_PLACE_GPU, &p) != 0) return 1;
  if (((unsigned char*)p)[bytes - 1] != 0x5A) return 1;
  if (tierd_release(c, t) != 0) return 1;
  if (tierd_mark_iteration(c) != 0) { /* ...to here, and plans */
    fprintf(stderr, "mark: %s\n", tierd_last_error(c));
    return 1;
  }
  /* Errors come back as codes with words. */
  const int64_t bad_shape[1] = {-1};
  uint64_t u = 0;
  if (tierd_lease(c, "c.bad", TIERD_CLASS_PARAM, TIERD_DTYPE_F32, bad_shape, 1, &u, NULL) != 3) return 1;
  if (strstr(tierd_last_error(c), "not positive") == NULL) return 1;
  if (tierd_release(c, t) != 9 || strstr(tierd_last_error(c), "not acquired") == NULL) return 1;
  if (tierd_acquire(c, 12345, TIERD_ACCESS_READ, TIERD_PLACE_HOST, &p) != 5) return 1;
  /* A step report; one with a negative step is refused as bad input (3). */
  if (tierd_report_step(c, 1, 2.5, 0.25, 1024) != 0) return 1;
  if (tierd_report_step(c, -1, 2.5, 0.25, 1024) != 3 || strstr(tierd_last_error(c), "step of 1 or more") == NULL)
    return 1;
  if (tierd_unlease(c, t) != 0) return 1;
  tierd_close(c);
  printf("c client ok\n");
  return 0;
}
