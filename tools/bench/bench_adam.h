// `strata bench adam`: host AdamW throughput beside a STREAM-style triad measured in the same run with
// the same threads, so the ratio means something on a shared, noisy machine.
#pragma once

#include <string>

namespace strata::tools {

// argv[0] is the command's name; then --threads T (1), --elems N (16777216), --isa NAME (widest),
// --copy bf16|fp16|none (bf16), --reps R (10), --json. Prints one JSON object with --json (params_per_s,
// bytes_per_param, triad_bytes_per_s, ratio_to_triad, ...), else one human line. Returns 0, or 2 on a
// usage error (message on stderr).
int RunBenchAdam(int argc, char** argv);
std::string BenchAdamUsage();  // printed by `strata bench adam --help`

}  // namespace strata::tools
