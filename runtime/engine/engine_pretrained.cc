// engine::LoadPretrained (pretrained_load.h): the engine's held ranges, read by runtime/checkpoint.
#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/engine/pretrained_load.h"

namespace strata::engine {

absl::StatusOr<checkpoint::RangeReadStats> LoadPretrained(Engine& engine,
                                                          const checkpoint::PretrainedCheckpoint& checkpoint,
                                                          absl::Span<const PretrainedTarget> targets,
                                                          const checkpoint::RangeReadOptions& options) {
  std::vector<checkpoint::RangeToRead> ranges;
  for (size_t i = 0; i < targets.size(); ++i) {
    const PretrainedTarget& t = targets[i];
    if (t.unit < 0 || t.unit >= engine.num_units() || t.param < 0 ||
        static_cast<size_t>(t.param) >= engine.layout(t.unit).params.size()) {
      return absl::OutOfRangeError(
          absl::StrCat("target ", i, ": unit ", t.unit, " parameter ", t.param, " does not exist"));
    }
    if (t.tensor >= checkpoint.tensors().size()) {
      return absl::OutOfRangeError(
          absl::StrCat("target ", i, ": tensor ", t.tensor, " of ", checkpoint.tensors().size()));
    }
    const shard::UnitLayout& layout = engine.layout(t.unit);
    const shard::ParamSlot& p = layout.params[t.param];
    const auto& tensor = checkpoint.tensors()[t.tensor];
    if (tensor.info.numel() != p.numel) {
      return absl::InvalidArgumentError(absl::StrCat(
          "safetensors file '", checkpoint.files()[tensor.file].path, "': tensor '", tensor.info.name, "' has ",
          tensor.info.numel(), " elements; parameter '", layout.name, ".", p.spec.name, "' has ", p.numel));
    }
    // Refused on every rank alike, also on one that keeps none of the parameter.
    STRATA_RETURN_IF_ERROR(checkpoint::CheckReadableAsF32(checkpoint, t.tensor));
    const auto [begin, end] = engine.HeldRange(t.unit);
    const size_t first = std::max(begin, p.offset_elems) - p.offset_elems;
    const size_t last = std::min(end, p.offset_elems + p.numel);
    if (last > p.offset_elems + first) {
      ranges.push_back(
          checkpoint::RangeToRead{t.tensor, first, last - p.offset_elems - first, static_cast<int64_t>(i)});
    }
  }
  return checkpoint::ReadRangesF32(
      checkpoint, ranges, options,
      [&](const checkpoint::RangeToRead& r, uint64_t first, const float* values, size_t count) -> absl::Status {
        for (size_t k = 0; k < count; ++k) {
          if (!std::isfinite(values[k])) {
            const auto& tensor = checkpoint.tensors()[r.tensor];
            return absl::InvalidArgumentError(absl::StrCat("weights file '", checkpoint.files()[tensor.file].path,
                                                           "': tensor '", tensor.info.name, "' holds ", values[k],
                                                           " at index ", first + k, "; weights must be finite"));
          }
        }
        const PretrainedTarget& t = targets[static_cast<size_t>(r.tag)];
        return engine.SetParamRange(t.unit, t.param, first, values, count);
      });
}

}  // namespace strata::engine
