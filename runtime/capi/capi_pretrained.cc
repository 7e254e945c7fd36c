// The C ABI of pretrained weights (strata.h "Pretrained weights"): a handle over
// checkpoint::PretrainedCheckpoint, and engine::LoadPretrained behind strata_engine_load_safetensors
// (docs/decisions/0037-pretrained-by-byte-ranges.md).
#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/capi/capi_internal.h"
#include "runtime/checkpoint/pretrained.h"
#include "runtime/engine/pretrained_load.h"

struct strata_safetensors {
  uint32_t magic = 0x5a7e0001;
  std::unique_ptr<strata::checkpoint::PretrainedCheckpoint> checkpoint;
};

namespace strata::capi {
namespace {

absl::Status CheckHandle(const strata_safetensors* c) {
  if (c == nullptr) return NullArgument("checkpoint");
  if (c->magic != 0x5a7e0001) return absl::InvalidArgumentError("checkpoint is not a strata_safetensors handle");
  return absl::OkStatus();
}

absl::Status CheckTensor(const strata_safetensors* c, size_t index) {
  STRATA_RETURN_IF_ERROR(CheckHandle(c));
  if (index >= c->checkpoint->tensors().size()) {
    return absl::OutOfRangeError(absl::StrCat("tensor ", index, " of ", c->checkpoint->tensors().size()));
  }
  return absl::OkStatus();
}

absl::Status Load(strata_engine* engine, const strata_safetensors* checkpoint, const int32_t* units,
                  const int32_t* params, const uint64_t* tensors, const uint64_t* at, size_t count,
                  const strata_load_options* options, strata_load_stats* out) {
  STRATA_RETURN_IF_ERROR(CheckEngine(engine));
  STRATA_RETURN_IF_ERROR(CheckHandle(checkpoint));
  if (count > 0 && (units == nullptr || params == nullptr || tensors == nullptr)) {
    return NullArgument(units == nullptr ? "units" : params == nullptr ? "params" : "tensors");
  }
  strata_load_options o = STRATA_LOAD_OPTIONS_INIT;
  if (options != nullptr) {
    STRATA_RETURN_IF_ERROR(ReadVersioned(options, STRATA_V1_SIZE(strata_load_options, reserved), "options", &o));
  }
  if (out != nullptr) STRATA_RETURN_IF_ERROR(CheckOutput(out, STRATA_V1_SIZE(strata_load_stats, backend), "out"));
  if (!engine->finalized) return absl::FailedPreconditionError("the engine is not finalized");
  if (engine->in_micro_batch || engine->open_uses > 0) {
    return absl::FailedPreconditionError("inside a micro-batch or while a unit is begun; load weights between steps");
  }
  checkpoint::RangeReadOptions ro;
  switch (o.io_backend) {
    case 0:
      ro.backend = offload::IoBackend::kAuto;
      break;
    case 1:
      ro.backend = offload::IoBackend::kUring;
      break;
    case 2:
      ro.backend = offload::IoBackend::kThreads;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("options.io_backend is ", o.io_backend, "; 0 (auto), 1 (io_uring) or 2 (threads)"));
  }
  if (o.io_depth > 0) ro.depth = std::min<uint32_t>(o.io_depth, 4096);
  if (o.staging_bytes > 0) ro.staging_bytes = std::min<uint64_t>(o.staging_bytes, 1ull << 30);
  if (o.staging_buffers > 0) ro.staging_buffers = std::min<uint32_t>(o.staging_buffers, 64);
  std::vector<engine::PretrainedTarget> targets(count);
  for (size_t i = 0; i < count; ++i) {
    STRATA_RETURN_IF_ERROR(CheckFinalizedParam(engine, units[i], params[i]));
    targets[i] = engine::PretrainedTarget{units[i], params[i], static_cast<size_t>(tensors[i]), at != nullptr,
                                          at != nullptr ? at[i] : 0};
    if (tensors[i] >= checkpoint->checkpoint->tensors().size()) {
      return absl::OutOfRangeError(absl::StrCat("tensors[", i, "] is ", tensors[i], "; the checkpoint has ",
                                                checkpoint->checkpoint->tensors().size()));
    }
  }
  STRATA_ASSIGN_OR_RETURN(const engine::Engine::NvmeTraffic before, engine->engine->nvme_traffic());
  absl::StatusOr<checkpoint::RangeReadStats> stats =
      engine::LoadPretrained(*engine->engine, *checkpoint->checkpoint, targets, ro);
  if (!stats.ok()) {
    if (stats.status().code() == absl::StatusCode::kUnavailable) {  // io_uring asked for and not available
      return absl::UnimplementedError(stats.status().message());
    }
    return stats.status();
  }
  STRATA_ASSIGN_OR_RETURN(const engine::Engine::NvmeTraffic after, engine->engine->nvme_traffic());
  if (out != nullptr) {
    strata_load_stats s = STRATA_LOAD_STATS_INIT;
    s.bytes_read = stats->bytes_read;
    s.requests = stats->requests;
    s.fixed_buffer_ios = stats->fixed_buffer_ios;
    s.elements = stats->elements;
    s.seconds = stats->seconds;
    const size_t n = std::min(stats->backend.size(), sizeof(s.backend) - 1);
    std::memcpy(s.backend, stats->backend.data(), n);
    s.backend[n] = '\0';
    s.nvme_bytes_written = after.written_bytes - before.written_bytes;
    s.nvme_bytes_read = after.read_bytes - before.read_bytes;
    WriteVersioned(s, out);
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace strata::capi

using strata::capi::Call;
using strata::capi::NullArgument;

strata_status strata_safetensors_open(const char* path, strata_safetensors** out) {
  return Call(__func__, [&]() -> absl::Status {
    if (path == nullptr) return NullArgument("path");
    if (out == nullptr) return NullArgument("out");
    *out = nullptr;
    STRATA_ASSIGN_OR_RETURN(auto c, strata::checkpoint::PretrainedCheckpoint::Open(path));
    auto handle = std::make_unique<strata_safetensors>();
    handle->checkpoint = std::move(c);
    *out = handle.release();
    return absl::OkStatus();
  });
}

strata_status strata_safetensors_close(strata_safetensors* checkpoint) {
  return Call(__func__, [&]() -> absl::Status {
    if (checkpoint == nullptr) return absl::OkStatus();
    STRATA_RETURN_IF_ERROR(strata::capi::CheckHandle(checkpoint));
    checkpoint->magic = 0;
    delete checkpoint;
    return absl::OkStatus();
  });
}

strata_status strata_safetensors_num_tensors(const strata_safetensors* checkpoint, size_t* out) {
  return Call(__func__, [&]() -> absl::Status {
    STRATA_RETURN_IF_ERROR(strata::capi::CheckHandle(checkpoint));
    if (out == nullptr) return NullArgument("out");
    *out = checkpoint->checkpoint->tensors().size();
    return absl::OkStatus();
  });
}

strata_status strata_safetensors_tensor_info(const strata_safetensors* checkpoint, size_t index,
                                             strata_safetensors_tensor* out) {
  return Call(__func__, [&]() -> absl::Status {
    STRATA_RETURN_IF_ERROR(strata::capi::CheckTensor(checkpoint, index));
    STRATA_RETURN_IF_ERROR(
        strata::capi::CheckOutput(out, STRATA_V1_SIZE(strata_safetensors_tensor, file_data_bytes), "out"));
    const auto& t = checkpoint->checkpoint->tensors()[index];
    const auto& f = checkpoint->checkpoint->files()[t.file];
    strata_safetensors_tensor s = STRATA_SAFETENSORS_TENSOR_INIT;
    s.name = t.info.name.c_str();
    s.dtype = t.info.dtype.c_str();
    s.shape = t.info.shape.data();
    s.ndim = static_cast<int32_t>(t.info.shape.size());
    s.data_begin = t.info.begin;
    s.data_end = t.info.end;
    s.file = f.path.c_str();
    s.file_data_bytes = f.data_bytes;
    strata::capi::WriteVersioned(s, out);
    return absl::OkStatus();
  });
}

strata_status strata_safetensors_read(const strata_safetensors* checkpoint, size_t index, uint64_t offset, void* out,
                                      size_t bytes) {
  return Call(__func__, [&]() -> absl::Status {
    STRATA_RETURN_IF_ERROR(strata::capi::CheckTensor(checkpoint, index));
    if (out == nullptr && bytes > 0) return NullArgument("out");
    return checkpoint->checkpoint->ReadRaw(checkpoint->checkpoint->tensors()[index], offset, out, bytes);
  });
}

strata_status strata_engine_load_safetensors(strata_engine* engine, const strata_safetensors* checkpoint,
                                             const int32_t* units, const int32_t* params, const uint64_t* tensors,
                                             size_t count, const strata_load_options* options, strata_load_stats* out) {
  return Call(__func__, [&] {
    return strata::capi::Load(engine, checkpoint, units, params, tensors, nullptr, count, options, out);
  });
}

strata_status strata_engine_load_safetensors_at(strata_engine* engine, const strata_safetensors* checkpoint,
                                                const int32_t* units, const int32_t* params, const uint64_t* tensors,
                                                const uint64_t* at, size_t count, const strata_load_options* options,
                                                strata_load_stats* out) {
  return Call(__func__, [&]() -> absl::Status {
    if (count > 0 && at == nullptr) return strata::capi::NullArgument("at");
    return strata::capi::Load(engine, checkpoint, units, params, tensors, at, count, options, out);
  });
}
