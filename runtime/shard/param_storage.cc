#include "runtime/shard/param_storage.h"

#include <algorithm>

#include "absl/status/status.h"
#include "runtime/base/status.h"

namespace strata::shard {

absl::StatusOr<char*> ParamStorage::Open(const ParamRange& r, bool keep) {
  if (is_open_) return absl::InternalError("ParamStorage::Open with a range already open");
  if (r.bytes == 0) return nullptr;
  if (r.cache != nullptr) {  // the cache writes whole shards: a part of one keeps the rest
    const bool whole = r.offset == 0 && r.bytes == r.shard_bytes;
    STRATA_ASSIGN_OR_RETURN(void* dst, r.cache->BeginWrite(r.unit, keep || !whole));
    open_ = r;
    is_open_ = true;
    return static_cast<char*>(dst) + r.offset;
  }
  open_ = r;
  if (r.ops->host_visible()) {
    is_open_ = true;
    return r.params + r.offset;
  }
  // Device memory: through a host copy of the range.
  scratch_.resize(std::max(scratch_.size(), r.bytes));
  if (keep) STRATA_RETURN_IF_ERROR(r.ops->ToHost(scratch_.data(), r.params + r.offset, r.bytes));
  is_open_ = true;
  return scratch_.data();
}

absl::Status ParamStorage::Close(bool written) {
  if (!is_open_) return absl::OkStatus();  // an empty range, or an Open that failed
  is_open_ = false;
  const ParamRange& r = open_;
  if (r.cache != nullptr) {
    r.cache->EndWrite(r.unit, written);
    return absl::OkStatus();
  }
  if (!written || r.ops->host_visible()) return absl::OkStatus();
  return r.ops->FromHost(r.params + r.offset, scratch_.data(), r.bytes);
}

void ParamStorage::CloseRead() {
  if (!is_open_) return;
  is_open_ = false;
  if (open_.cache != nullptr) open_.cache->EndRead(open_.unit);
}

}  // namespace strata::shard
