/* A job with a slow rank, then a stuck one: the walk-through of docs/DIAGNOSING.md. Every rank makes 30
 * AllReduces of 1 MiB; rank 2 computes 20 ms longer than the others before each call from the 11th on,
 * and before the 31st it stops for good (a dataloader that never returns, say). Run it as
 *   CHORUS_TIMEOUT=3 CHORUS_TRACE=/tmp/trace chorusrun -n 4 ./slow_rank
 * then chorus-info --flight on the dump folder and chorus-info --trace /tmp/trace. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "chorus.h"

int main(void) {
  ncclComm_t comm;
  if (chorusInitFromEnv(&comm) != ncclSuccess) return 1;
  int rank, n;
  ncclCommUserRank(comm, &rank);
  ncclCommCount(comm, &n);
  size_t count = 1 << 18;
  float* buf = calloc(count, sizeof(float));
  for (int i = 0; i < 31; i++) {
    usleep(5000); /* every rank's own work between calls */
    if (rank == 2 && i >= 10) usleep(20000);
    if (rank == 2 && i == 30) sleep(10); /* stuck outside the library */
    ncclResult_t r = ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, comm, NULL);
    if (r != ncclSuccess) {
      fprintf(stderr, "rank %d: call %d failed: %s\n", rank, i + 1, ncclGetErrorString(r));
      break;
    }
  }
  ncclCommAbort(comm);
  free(buf);
  return 0;
}
