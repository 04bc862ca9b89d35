/* chorus-info --calibrate (calibrate.c). */
#ifndef CHORUS_CALIBRATE_H
#define CHORUS_CALIBRATE_H
/* Measure the cost model's constants and write them to path; 0 on success. */
int calibrate_main(const char* path);
#endif
