// Fuzzes the engine config parser (runtime/engine/config.cc): the JSON text of --config / the C ABI's
// config_json, and the "key.path=value" overrides of --set. Input: the JSON text, then optionally a NUL
// byte followed by overrides, one per line. Properties beyond "no crash, leak or UB":
//  - every rejection is InvalidArgument (the file comment's contract; Internal would mean a JSON exception
//    reached the bug guard), with a non-empty message;
//  - without overrides, ParseConfig and ParseConfigWithOverrides(text, {}) agree (empty text aside);
//  - an accepted config holds the invariants config.h states (ranges, and that bf16 / fp16.enabled agree
//    with param_dtype).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"
#include "runtime/engine/config.h"
#include "tests/fuzz/fuzz_file.h"

namespace {

using strata::DType;
using strata::engine::EngineConfig;
using strata::engine::OffloadDevice;

constexpr size_t kMaxOverrides = 16;

void ExpectInvalidArgument(const absl::Status& s) {
  STRATA_FUZZ_EXPECT(s.code() == absl::StatusCode::kInvalidArgument && !s.message().empty(),
                     "unexpected error: %s", s.ToString().c_str());
}

void ExpectInvariants(const EngineConfig& c) {
  STRATA_FUZZ_EXPECT(c.stage >= 0 && c.stage <= 3, "stage %d", c.stage);
  STRATA_FUZZ_EXPECT(c.train_micro_batch_size_per_gpu >= 1, "micro batch %lld",
                     static_cast<long long>(c.train_micro_batch_size_per_gpu));
  STRATA_FUZZ_EXPECT(c.gradient_accumulation_steps >= 1, "accumulation %d", c.gradient_accumulation_steps);
  STRATA_FUZZ_EXPECT(c.max_live_units >= 1, "max_live_units %d", c.max_live_units);
  STRATA_FUZZ_EXPECT(c.prefetch_depth >= 0, "prefetch_depth %d", c.prefetch_depth);
  STRATA_FUZZ_EXPECT(c.collective_timeout_ms >= 1, "collective_timeout_ms %lld",
                     static_cast<long long>(c.collective_timeout_ms));
  STRATA_FUZZ_EXPECT(c.offload_param.buffer_count >= 1 && c.offload_optimizer.buffer_count >= 1, "buffer_count");
  STRATA_FUZZ_EXPECT(c.bf16 == (c.param_dtype == DType::kBF16), "bf16 disagrees with param_dtype");
  STRATA_FUZZ_EXPECT(c.fp16.enabled == (c.param_dtype == DType::kF16), "fp16.enabled disagrees with param_dtype");
  STRATA_FUZZ_EXPECT(c.reduce_dtype != DType::kF16, "reduce_dtype fp16");
  STRATA_FUZZ_EXPECT(c.offload_param.device == OffloadDevice::kNone || c.stage == 3, "offload_param below stage 3");
  STRATA_FUZZ_EXPECT(c.offload_optimizer.device == OffloadDevice::kNone || c.stage >= 1,
                     "offload_optimizer at stage 0");
  for (const auto* o : {&c.offload_param, &c.offload_optimizer}) {
    STRATA_FUZZ_EXPECT(o->device != OffloadDevice::kNvme || !o->nvme_path.empty(), "nvme offload without a path");
  }
  STRATA_FUZZ_EXPECT(c.gradient_clipping >= 0, "gradient_clipping %g", c.gradient_clipping);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string_view text = input.substr(0, nul);
  if (nul == std::string_view::npos) {
    auto plain = strata::engine::ParseConfig(text);
    auto merged = strata::engine::ParseConfigWithOverrides(text, {});
    if (plain.ok()) ExpectInvariants(*plain); else ExpectInvalidArgument(plain.status());
    if (merged.ok()) ExpectInvariants(*merged); else ExpectInvalidArgument(merged.status());
    const bool blank = absl::StripAsciiWhitespace(absl::string_view(text.data(), text.size())).empty();
    STRATA_FUZZ_EXPECT(blank || plain.ok() == merged.ok(), "ParseConfig says %s, ParseConfigWithOverrides says %s",
                       plain.status().ToString().c_str(), merged.status().ToString().c_str());
    return 0;
  }
  const std::string_view rest = input.substr(nul + 1);
  std::vector<std::string> overrides =
      absl::StrSplit(absl::string_view(rest.data(), rest.size()), '\n', absl::SkipEmpty());
  if (overrides.size() > kMaxOverrides) overrides.resize(kMaxOverrides);
  auto cfg = strata::engine::ParseConfigWithOverrides(text, overrides);
  if (cfg.ok()) ExpectInvariants(*cfg); else ExpectInvalidArgument(cfg.status());
  return 0;
}
