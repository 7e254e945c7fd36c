// GPT-2 model shapes: presets and validation.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace strata::gpt {

struct GptConfig {
  int layers = 4;
  int d_model = 128;
  int heads = 4;
  int seq_len = 128;  // also the number of position embeddings
  int vocab = 256;    // 256 = byte tokens; 50257 = GPT-2's BPE
};

// gpt2-tiny (4 layers, d 128, 4 heads, seq 128, byte vocab), gpt2 (124M), gpt2-medium, gpt2-large, gpt2-xl.
absl::StatusOr<GptConfig> GptPreset(absl::string_view name);
absl::Status Validate(const GptConfig& c);
int64_t NumParams(const GptConfig& c);
// Forward FLOPs per token for the matmuls (2 x params in them, plus attention), the usual 6N estimate
// for a training step is 3x this.
double ForwardFlopsPerToken(const GptConfig& c);
std::string Describe(const GptConfig& c);

}  // namespace strata::gpt
