#include "runtime/checkpoint/reshard.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/checkpoint/consolidate.h"

namespace strata::checkpoint {

uint64_t CopyOverlap(const ShardRange& range, absl::Span<const float> values, uint64_t lo, uint64_t hi, float* dst) {
  const uint64_t b = std::max(lo, range.begin), e = std::min(hi, range.begin + range.count);
  if (b >= e) return 0;
  std::copy(values.begin() + (b - range.begin), values.begin() + (e - range.begin), dst + (b - lo));
  return e - b;
}

std::vector<SaveRange> RangesToSave(const ManifestUnit& unit, uint64_t lo, uint64_t hi,
                                    absl::Span<const std::string> kinds) {
  std::vector<SaveRange> out;
  for (size_t k = 0; k < kinds.size(); ++k) {
    for (const ManifestParam& p : unit.params) {
      const uint64_t b = std::max(lo, p.offset), e = std::min(hi, p.offset + p.numel);
      if (b >= e) continue;
      out.push_back({ShardRange{unit.name, p.name, kinds[k], b, e - b}, k});
    }
  }
  return out;
}

absl::StatusOr<const ShardReader*> ShardReaders::Get(int rank) {
  auto it = open_.find(rank);
  if (it != open_.end()) return &it->second;
  STRATA_ASSIGN_OR_RETURN(ShardReader r, OpenShard(dir_, man_, rank));
  return &open_.emplace(rank, std::move(r)).first->second;
}

absl::Status ReadResharded(ShardReaders& shards, const std::string& unit, const std::string& param,
                           const std::string& kind, uint64_t lo, uint64_t hi, uint64_t saved_slice, float* dst) {
  if (saved_slice == 0) return absl::DataLossError(absl::StrCat("checkpoint unit ", unit, " has no elements"));
  std::vector<float> buf;
  for (uint64_t s = lo / saved_slice; s * saved_slice < hi; ++s) {
    STRATA_ASSIGN_OR_RETURN(const ShardReader* r, shards.Get(static_cast<int>(s)));
    const ShardRange* range = r->Find(unit, param, kind);
    // The part of [lo, hi) the saved layout puts in shard s; the range must hold all of it.
    const uint64_t b = std::max(lo, s * saved_slice), e = std::min(hi, (s + 1) * saved_slice);
    if (b >= e) continue;
    if (range == nullptr || range->begin > b || range->begin + range->count < e) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint shard of rank ", s, " lacks ", unit, ".", param, " ", kind, " elements [", b, ", ", e,
          range == nullptr ? ")"
                           : absl::StrCat(") (it holds [", range->begin, ", ", range->begin + range->count, "))")));
    }
    STRATA_RETURN_IF_ERROR(r->Read(*range, &buf));
    CopyOverlap(*range, buf, b, e, dst + (b - lo));
  }
  return absl::OkStatus();
}

}  // namespace strata::checkpoint
