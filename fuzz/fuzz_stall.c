/* libFuzzer target: stall records as other processes of a job send them (the answer to a STALL_Q_RECORD
 * query, fault/stall_job.c). stall_wire_ok must refuse whatever the report's formatter could not print
 * correctly (a state, call, signal or count out of range, a host name without its end), and the formatter
 * must print, within its buffer, every record it accepts beside records that were refused. */
#include <stdio.h>
#include <string.h>

#include "fault/stall.h"

enum { N = 3 };

int LLVMFuzzerTestOneInput(const unsigned char* data, size_t size) {
  struct stall_wire w[N];
  memset(w, 0, sizeof w);
  memcpy(w, data, size < sizeof w ? size : sizeof w);
  uint64_t hash = w[0].comm_hash;
  for (int r = 0; r < N; r++) {
    w[r].note[sizeof w[r].note - 1] = '\0'; /* local only: never read from the wire */
    if (!stall_wire_ok(&w[r], hash, r, N)) {
      memset(&w[r], 0, sizeof w[r]);
      w[r].state = STALL_ST_NOANSWER;
      snprintf(w[r].note, sizeof w[r].note, "refused");
    }
  }
  char out[2048];
  size_t len = stall_format(w, N, hash, "", out, sizeof out);
  if (len >= sizeof out || out[len] != '\0') __builtin_trap();
  return 0;
}
