// engine::LoadPretrained (pretrained_load.h): the engine's held ranges, read by runtime/checkpoint.
#include <algorithm>
#include <cmath>
#include <memory>
#include <utility>
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
    const uint64_t n = tensor.info.numel();
    if (t.piece ? t.at > p.numel || n > p.numel - t.at : n != p.numel) {
      return absl::InvalidArgumentError(absl::StrCat(
          "safetensors file '", checkpoint.files()[tensor.file].path, "': tensor '", tensor.info.name, "' has ", n,
          " elements; parameter '", layout.name, ".", p.spec.name, "' has ", p.numel,
          t.piece ? absl::StrCat(" (the tensor's elements go from element ", t.at, ")") : ""));
    }
    // Refused on every rank alike, also on one that keeps none of the parameter.
    STRATA_RETURN_IF_ERROR(checkpoint::CheckReadableAsF32(checkpoint, t.tensor));
    // The unit's held elements [begin, end) against the tensor's, [p.offset_elems + t.at, ... + n).
    const auto [begin, end] = engine.HeldRange(t.unit);
    const size_t lo = p.offset_elems + t.at;
    const size_t first = std::max(begin, lo) - lo;
    const size_t last = std::min(end, lo + n);
    if (last > lo + first) {
      ranges.push_back(checkpoint::RangeToRead{t.tensor, first, last - lo - first, static_cast<int64_t>(i)});
    }
  }
  // Note [Unit-at-once writes] (engine.cc): the ranges go unit by unit (within a unit in file order), so each
  // unit's values arrive together; they are staged and written with one SetParamRanges when its last range is
  // in. At most one unit's held values are staged at a time.
  const auto& tensors = checkpoint.tensors();
  std::stable_sort(
      ranges.begin(), ranges.end(), [&](const checkpoint::RangeToRead& x, const checkpoint::RangeToRead& y) {
        const int ux = targets[static_cast<size_t>(x.tag)].unit, uy = targets[static_cast<size_t>(y.tag)].unit;
        if (ux != uy) return ux < uy;
        const auto& tx = tensors[x.tensor];
        const auto& ty = tensors[y.tensor];
        return std::make_pair(tx.file, tx.info.begin) < std::make_pair(ty.file, ty.info.begin);
      });
  int staged_unit = -1;
  std::vector<float> staged;                // the values received for staged_unit, piece after piece
  std::vector<Engine::ParamValues> pieces;  // their parameter ranges
  std::vector<size_t> starts;               // where each piece's values begin in staged
  auto flush = [&]() -> absl::Status {
    if (staged_unit < 0) return absl::OkStatus();
    for (size_t i = 0; i < pieces.size(); ++i) pieces[i].values = staged.data() + starts[i];
    const absl::Status s = engine.SetParamRanges(staged_unit, pieces);
    starts.clear();
    staged_unit = -1;
    staged.clear();
    pieces.clear();
    return s;
  };
  // The values of each piece the reader hands back, checked and staged by unit.
  auto take = [&](const checkpoint::RangeToRead& r, uint64_t first, absl::Span<const float> values) -> absl::Status {
    for (size_t k = 0; k < values.size(); ++k) {
      if (!std::isfinite(values[k])) {
        const auto& tensor = tensors[r.tensor];
        return absl::InvalidArgumentError(absl::StrCat("weights file '", checkpoint.files()[tensor.file].path,
                                                       "': tensor '", tensor.info.name, "' holds ", values[k],
                                                       " at index ", first + k, "; weights must be finite"));
      }
    }
    const PretrainedTarget& t = targets[static_cast<size_t>(r.tag)];
    if (t.unit != staged_unit) STRATA_RETURN_IF_ERROR(flush());
    staged_unit = t.unit;
    pieces.push_back(Engine::ParamValues{t.param, t.at + first, nullptr, values.size()});
    starts.push_back(staged.size());
    staged.insert(staged.end(), values.begin(), values.end());
    return absl::OkStatus();
  };
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<checkpoint::RangeReader> reader,
                          checkpoint::RangeReader::Open(checkpoint, ranges, options));
  while (true) {
    STRATA_ASSIGN_OR_RETURN(const bool more, reader->Next());
    if (!more) break;
    STRATA_RETURN_IF_ERROR(take(reader->range(), reader->first(), reader->values()));
  }
  STRATA_ASSIGN_OR_RETURN(const checkpoint::RangeReadStats stats, reader->Finish());
  STRATA_RETURN_IF_ERROR(flush());
  return stats;
}

}  // namespace strata::engine
