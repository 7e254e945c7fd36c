#include "models/gpt/model/gpt_config.h"

#include "absl/strings/str_cat.h"

namespace strata::gpt {

absl::StatusOr<GptConfig> GptPreset(absl::string_view name) {
  if (name == "gpt2-tiny") return GptConfig{4, 128, 4, 128, 256};
  if (name == "gpt2") return GptConfig{12, 768, 12, 1024, 50257};
  if (name == "gpt2-medium") return GptConfig{24, 1024, 16, 1024, 50257};
  if (name == "gpt2-large") return GptConfig{36, 1280, 20, 1024, 50257};
  if (name == "gpt2-xl") return GptConfig{48, 1600, 25, 1024, 50257};
  return absl::InvalidArgumentError(
      absl::StrCat("unknown model '", name, "' (use gpt2-tiny, gpt2, gpt2-medium, gpt2-large or gpt2-xl)"));
}

absl::Status Validate(const GptConfig& c) {
  if (c.layers < 1 || c.d_model < 1 || c.heads < 1 || c.seq_len < 1 || c.vocab < 2) {
    return absl::InvalidArgumentError(absl::StrCat("model shape ", Describe(c), " has a non-positive dimension"));
  }
  if (c.d_model % c.heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--d-model ", c.d_model, " is not a multiple of --heads ", c.heads));
  }
  return absl::OkStatus();
}

int64_t NumParams(const GptConfig& c) {
  const int64_t C = c.d_model;
  const int64_t block = 2 * C + (C * 3 * C + 3 * C) + (C * C + C) + 2 * C + (C * 4 * C + 4 * C) + (4 * C * C + C);
  return int64_t{c.vocab} * C + int64_t{c.seq_len} * C + c.layers * block + 2 * C;
}

double ForwardFlopsPerToken(const GptConfig& c) {
  const double C = c.d_model, L = c.layers, T = c.seq_len, V = c.vocab;
  const double matmul = L * (C * 3 * C + C * C + 8 * C * C) + C * V;
  const double attention = L * 2.0 * T * C;  // q k^T and att v, averaged over the causal triangle x2
  return 2.0 * (matmul + attention / 2.0);
}

std::string Describe(const GptConfig& c) {
  return absl::StrCat("layers ", c.layers, ", d_model ", c.d_model, ", heads ", c.heads, ", seq ", c.seq_len,
                      ", vocab ", c.vocab);
}

}  // namespace strata::gpt
