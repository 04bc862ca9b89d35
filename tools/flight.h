/* chorus-info's readers of what ranks wrote: flight recorder dumps (flight.c) and traces (trace_merge.c). */
#ifndef CHORUS_TOOLS_FLIGHT_H
#define CHORUS_TOOLS_FLIGHT_H

#include <stdio.h>

/* chorus-info --flight DIR: the job-wide account of every dump in DIR, written to out. 0 when some were
 * read. */
int flight_report(const char* dir, FILE* out);
/* chorus-info --trace DIR [OUT.json [OUT.svg]]: one job-wide trace from every rank's, and its picture. */
int trace_main(int argc, char** argv);

#endif
