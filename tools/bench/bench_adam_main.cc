// Standalone `strata bench adam` (tools/bench/bench_adam.h) until the strata CLI dispatches to it.
#include "tools/bench/bench_adam.h"

int main(int argc, char** argv) { return strata::tools::RunBenchAdam(argc, argv); }
