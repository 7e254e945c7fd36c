#include "models/gpt/train/model_flags.h"

#include "runtime/base/status.h"

namespace strata::tools {

std::vector<spec::FlagDef> ModelFlagDefs() {
  return {{"model", false, "gpt2-tiny | gpt2 | gpt2-medium | gpt2-large | gpt2-xl (default gpt2-tiny)"},
          {"layers", false, "override the preset's number of blocks"},
          {"d-model", false, "override the preset's width"},
          {"heads", false, "override the preset's attention heads"},
          {"seq-len", false, "override the preset's sequence length"},
          {"vocab", false, "override the preset's vocabulary (256 = bytes)"}};
}

absl::StatusOr<gpt::GptConfig> ModelFromFlags(const spec::Flags& f) {
  STRATA_ASSIGN_OR_RETURN(gpt::GptConfig c, gpt::GptPreset(f.Str("model", "gpt2-tiny")));
  STRATA_ASSIGN_OR_RETURN(int64_t layers, f.Int("layers", c.layers));
  STRATA_ASSIGN_OR_RETURN(int64_t d, f.Int("d-model", c.d_model));
  STRATA_ASSIGN_OR_RETURN(int64_t heads, f.Int("heads", c.heads));
  STRATA_ASSIGN_OR_RETURN(int64_t seq, f.Int("seq-len", c.seq_len));
  STRATA_ASSIGN_OR_RETURN(int64_t vocab, f.Int("vocab", c.vocab));
  for (int64_t v : {layers, d, heads, seq, vocab}) {
    if (v < 1 || v > (int64_t{1} << 30)) return absl::InvalidArgumentError("model dimensions must be in [1, 2^30]");
  }
  c = gpt::GptConfig{static_cast<int>(layers), static_cast<int>(d), static_cast<int>(heads), static_cast<int>(seq),
                     static_cast<int>(vocab)};
  STRATA_RETURN_IF_ERROR(gpt::Validate(c));
  return c;
}

}  // namespace strata::tools
