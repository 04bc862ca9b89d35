// versions.c compiled as C++: the same program, with each header seen by a C++ compiler.
#include "versions.c"
