// strata_engine_*: creation from a JSON config, unit registration, finalize, introspection, whole-parameter
// gather / set, stats, checkpoints and destruction. The per-step hooks are in capi_hooks.cc.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <filesystem>

#include "nlohmann/json.hpp"

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/capi/capi_internal.h"
#include "runtime/checkpoint/manifest.h"
#include "runtime/engine/config.h"

#include "runtime/device/cuda_backend.h"

namespace strata::capi {
namespace {

// Far above any real tensor's rank; a larger ndim is a caller's bug (it once copied a million extents).
constexpr int32_t kMaxNdim = 64;

absl::StatusOr<shard::Init> ToInit(int32_t kind, float value, const std::string& where) {
  if (kind == STRATA_INIT_ZEROS) return shard::Init::Zeros();
  if (kind == STRATA_INIT_ONES) return shard::Init::Ones();
  if (kind != STRATA_INIT_CONSTANT && kind != STRATA_INIT_NORMAL && kind != STRATA_INIT_UNIFORM) {
    return absl::InvalidArgumentError(absl::StrCat(where, ".init is ", kind, ", not a strata_init_kind"));
  }
  if (!std::isfinite(value)) {  // it would fill the parameter with NaN / Inf and still return STRATA_OK
    return absl::InvalidArgumentError(absl::StrCat(where, ".init_value is ", value, "; it must be finite"));
  }
  if (kind == STRATA_INIT_CONSTANT) return shard::Init::Constant(value);
  return kind == STRATA_INIT_NORMAL ? shard::Init::Normal(value) : shard::Init::Uniform(value);
}

// params[i] of a caller's array whose stride is params[0].struct_size (strata.h).
absl::StatusOr<shard::ParamSpec> ReadSpec(const strata_param_spec* params, int32_t i) {
  const std::string where = absl::StrCat("params[", i, "]");
  const size_t kMin = STRATA_V1_SIZE(strata_param_spec, init_value);
  STRATA_RETURN_IF_ERROR(CheckHeader(params, kMin, sizeof(strata_param_spec), "params[0]", /*input=*/true));
  const size_t stride = params[0].struct_size;
  const auto* raw = reinterpret_cast<const strata_param_spec*>(reinterpret_cast<const char*>(params) + i * stride);
  // The element's own struct_size is checked against the stride before anything past its header is read:
  // a larger one would send ReadVersioned's scan of unknown bytes past the element (and the array).
  if (raw->struct_size != stride) {
    return VersionError(absl::StrCat(where, ".struct_size is ", raw->struct_size, " but params[0].struct_size is ",
                                     stride, ": every element of the array must have the same layout"));
  }
  strata_param_spec p = STRATA_PARAM_SPEC_INIT;
  STRATA_RETURN_IF_ERROR(ReadVersioned(raw, kMin, where.c_str(), &p));
  if (p.name == nullptr) return NullArgument(absl::StrCat(where, ".name").c_str());
  if (p.ndim < 1) return absl::InvalidArgumentError(absl::StrCat(where, ".ndim is ", p.ndim, "; it must be >= 1"));
  if (p.ndim > kMaxNdim) {
    return absl::InvalidArgumentError(absl::StrCat(where, ".ndim is ", p.ndim, "; it must be <= ", kMaxNdim));
  }
  if (p.shape == nullptr) return NullArgument(absl::StrCat(where, ".shape").c_str());
  STRATA_ASSIGN_OR_RETURN(shard::Init init, ToInit(p.init, p.init_value, where));
  if (p.reserved != 0) {  // reserved for a later field: a caller that sets it needs a newer library
    return VersionError(absl::StrCat(where, ".reserved is ", p.reserved, "; it must be 0"));
  }
  shard::ParamSpec spec{p.name, std::vector<int64_t>(p.shape, p.shape + p.ndim), p.weight_decay != 0, init,
                        p.frozen != 0};
  // A param group's own lr and weight decay (Note [Param groups]); UnitLayout::Build checks the values.
  if (p.has_own_lr != 0) spec.own_lr = p.own_lr;
  if (p.has_own_weight_decay != 0) spec.own_weight_decay = p.own_weight_decay;
  return spec;
}

// The calling thread's current CUDA device (cudaSetDevice before strata_engine_create picks another),
// through the CUDA back-end module (runtime/base/module.h).
absl::StatusOr<std::unique_ptr<device::Device>> CreateCudaDevice() {
#if STRATA_WITH_CUDA
  absl::StatusOr<const device::CudaDeviceApi*> cuda = device::CudaDeviceBackend();
  if (!cuda.ok()) return Annotate(cuda.status(), "STRATA_DEVICE_CUDA");
  if ((*cuda)->device_count() == 0) {
    return absl::FailedPreconditionError("STRATA_DEVICE_CUDA: no CUDA device is visible to this process");
  }
  STRATA_ASSIGN_OR_RETURN(const int ordinal, (*cuda)->current_ordinal());
  return (*cuda)->create(ordinal);
#else
  return absl::UnimplementedError("STRATA_DEVICE_CUDA: this libstrata was built without CUDA (STRATA_WITH_CUDA=OFF); "
                                  "use STRATA_DEVICE_HOST");
#endif
}

absl::Status CreateEngine(strata_comm* comm, const strata_engine_options* options, strata_engine** out) {
  STRATA_RETURN_IF_ERROR(CheckComm(comm));
  if (out == nullptr) return NullArgument("out");
  *out = nullptr;
  strata_engine_options o = STRATA_ENGINE_OPTIONS_INIT;
  if (options != nullptr) {
    STRATA_RETURN_IF_ERROR(ReadVersioned(options, STRATA_V1_SIZE(strata_engine_options, device), "options", &o));
  }
  if (o.device != STRATA_DEVICE_HOST && o.device != STRATA_DEVICE_CUDA) {
    return absl::InvalidArgumentError(absl::StrCat("options.device is ", o.device, ", not a strata_device_kind"));
  }
  const std::string json = o.config_json == nullptr || o.config_json[0] == '\0' ? "{}" : o.config_json;
  engine::ConfigFacts facts;  // Note ["auto"], runtime/engine/config_deepspeed.h
  facts.world_size = comm->comm->size();
  facts.hidden_size = std::max<int64_t>(o.hidden_size, 0);
  absl::StatusOr<engine::EngineConfig> config = engine::ParseConfigWithOverrides(json, {}, facts);
  if (!config.ok()) return Annotate(config.status(), "options.config_json");
  auto e = std::make_unique<strata_engine>();
  if (o.device == STRATA_DEVICE_CUDA) {
    STRATA_ASSIGN_OR_RETURN(e->device, CreateCudaDevice());
  } else {
    if (comm->comm->device_buffers()) {
      return absl::InvalidArgumentError("an NCCL communicator (strata_comm_create_nccl) needs STRATA_DEVICE_CUDA");
    }
    e->device = std::make_unique<device::HostDevice>();
  }
  STRATA_ASSIGN_OR_RETURN(e->engine, engine::Engine::Create(*config, *comm->comm, *e->device));
  e->comm = comm;
  ++comm->live_engines;
  *out = e.release();
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<shard::ParamSpec>> ValidateUnitSpecs(const char* name, const strata_param_spec* params,
                                                                int32_t num_params, int world_size) {
  if (name == nullptr) return NullArgument("name");
  if (num_params < 1) return absl::InvalidArgumentError(absl::StrCat("unit '", name, "': num_params is ", num_params));
  if (params == nullptr) return NullArgument("params");
  std::vector<shard::ParamSpec> specs;
  for (int32_t i = 0; i < num_params; ++i) {
    STRATA_ASSIGN_OR_RETURN(shard::ParamSpec spec, ReadSpec(params, i));
    specs.push_back(std::move(spec));
  }
  // The layout's own checks (unique names, positive extents, sizes that fit) on a copy: the engine lays
  // the unit out again when it registers it.
  STRATA_RETURN_IF_ERROR(shard::UnitLayout::Build(name, specs, world_size).status());
  return specs;
}

namespace {

absl::Status RegisterUnit(strata_engine* e, const char* name, const strata_param_spec* params, int32_t num_params,
                          int32_t* out_unit) {
  STRATA_RETURN_IF_ERROR(CheckEngine(e));
  STRATA_ASSIGN_OR_RETURN(std::vector<shard::ParamSpec> specs,
                          ValidateUnitSpecs(name, params, num_params, e->engine->world_size()));
  STRATA_ASSIGN_OR_RETURN(const int unit, e->engine->RegisterUnit(name, std::move(specs)));
  if (out_unit != nullptr) *out_unit = unit;
  return absl::OkStatus();
}

absl::Status Finalize(strata_engine* e) {
  STRATA_RETURN_IF_ERROR(CheckEngine(e));
  STRATA_RETURN_IF_ERROR(e->engine->Finalize());
  e->units.resize(e->engine->num_units());
  for (int u = 0; u < e->engine->num_units(); ++u) {
    const size_t n = e->engine->layout(u).params.size();
    e->units[u].params.assign(n, nullptr);
    e->units[u].grads.assign(n, nullptr);
  }
  e->finalized = true;
  return absl::OkStatus();
}

absl::Status ParamInfo(const strata_engine* e, int32_t unit, int32_t param, strata_param_info* out) {
  STRATA_RETURN_IF_ERROR(CheckRegistered(e, unit, param));
  STRATA_RETURN_IF_ERROR(CheckOutput(out, STRATA_V1_SIZE(strata_param_info, weight_decay), "out"));
  const shard::ParamSlot& p = e->engine->layout(unit).params[param];
  strata_param_info info = STRATA_PARAM_INFO_INIT;
  info.name = p.spec.name.c_str();
  info.shape = p.spec.shape.data();
  info.numel = p.numel;
  info.offset_elems = p.offset_elems;
  info.ndim = static_cast<int32_t>(p.spec.shape.size());
  info.dtype = ToCDType(e->engine->config().param_dtype);
  info.weight_decay = p.spec.weight_decay ? 1 : 0;
  WriteVersioned(info, out);
  return absl::OkStatus();
}

// Checks (unit, param, count) of a whole-parameter transfer against the layout.
absl::Status CheckTransfer(const strata_engine* e, int32_t unit, int32_t param, const void* data, size_t count,
                           const char* what) {
  STRATA_RETURN_IF_ERROR(CheckFinalizedParam(e, unit, param));
  if (data == nullptr) return NullArgument(what);
  const shard::ParamSlot& p = e->engine->layout(unit).params[param];
  if (count != p.numel) {
    return absl::InvalidArgumentError(absl::StrCat("parameter '", e->engine->layout(unit).name, ".", p.spec.name,
                                                   "' has ", p.numel, " elements, count is ", count));
  }
  return absl::OkStatus();
}

// Every value finite; the message names the first that is not by its element of the parameter.
absl::Status CheckFinite(const strata_engine* e, int32_t unit, int32_t param, const float* values, size_t count,
                         size_t offset) {
  for (size_t i = 0; i < count; ++i) {
    if (!std::isfinite(values[i])) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", e->engine->layout(unit).name, ".",
                                                     e->engine->layout(unit).params[param].spec.name, "': values[",
                                                     offset + i, "] is ", values[i], "; it must be finite"));
    }
  }
  return absl::OkStatus();
}

// The elements of a unit's flat buffer up to the end of its last parameter (what strata_engine_gather_unit copies).
size_t ParamExtent(const shard::UnitLayout& layout) {
  size_t extent = 0;
  for (const shard::ParamSlot& p : layout.params) extent = std::max(extent, p.offset_elems + p.numel);
  return extent;
}

absl::Status GetStats(const strata_engine* e, strata_stats* out) {
  STRATA_RETURN_IF_ERROR(CheckEngine(e));
  STRATA_RETURN_IF_ERROR(CheckOutput(out, STRATA_V1_SIZE(strata_stats, last_other_ms), "out"));
  const engine::MemoryStats m = e->engine->memory_stats();
  strata_stats s = STRATA_STATS_INIT;
  s.device_current_bytes = m.tier[static_cast<int>(memory::Tier::kDevice)].current_bytes;
  s.device_peak_bytes = m.tier[static_cast<int>(memory::Tier::kDevice)].peak_bytes;
  s.pinned_host_current_bytes = m.tier[static_cast<int>(memory::Tier::kPinnedHost)].current_bytes;
  s.pinned_host_peak_bytes = m.tier[static_cast<int>(memory::Tier::kPinnedHost)].peak_bytes;
  s.nvme_current_bytes = m.tier[static_cast<int>(memory::Tier::kNvme)].current_bytes;
  s.nvme_peak_bytes = m.tier[static_cast<int>(memory::Tier::kNvme)].peak_bytes;
  s.steps = e->engine->step();
  s.loss_scale = e->engine->loss_scale();
  const double* ms = e->clock.last_ms;
  s.last_step_ms = ms[0];
  s.last_compute_ms = ms[1];
  s.last_exposed_comm_ms = ms[2];
  s.last_exposed_io_ms = ms[3];
  s.last_optimizer_ms = ms[4];
  s.last_other_ms = ms[5];
  WriteVersioned(s, out);
  return absl::OkStatus();
}

absl::Status SaveCheckpoint(strata_engine* e, const char* root_dir, const char* trainer_json, bool async) {
  STRATA_RETURN_IF_ERROR(CheckEngine(e));
  if (root_dir == nullptr) return NullArgument("root_dir");
  const std::string trainer = trainer_json == nullptr ? "{}" : trainer_json;
  if (!nlohmann::json::accept(trainer)) {
    return absl::InvalidArgumentError("trainer_json is not a JSON document");
  }
  STRATA_RETURN_IF_ERROR(CheckBetweenSteps(e));
  const std::string step_dir =
      (std::filesystem::path(root_dir) / checkpoint::StepDirName(e->engine->step())).string();
  return async ? e->engine->SaveCheckpointAsync(step_dir, trainer) : e->engine->SaveCheckpoint(step_dir, trainer);
}

absl::Status LoadCheckpoint(strata_engine* e, const char* dir, const char** out_trainer_json) {
  STRATA_RETURN_IF_ERROR(CheckEngine(e));
  if (dir == nullptr) return NullArgument("dir");
  if (out_trainer_json != nullptr) *out_trainer_json = nullptr;
  STRATA_RETURN_IF_ERROR(CheckBetweenSteps(e));
  STRATA_ASSIGN_OR_RETURN(const std::string step_dir, checkpoint::ResolveCheckpoint(dir));
  STRATA_ASSIGN_OR_RETURN(e->loaded_trainer_json, e->engine->LoadCheckpoint(step_dir));
  if (out_trainer_json != nullptr) *out_trainer_json = e->loaded_trainer_json.c_str();
  return absl::OkStatus();
}

#undef STRATA_V1_SIZE

}  // namespace

// Checkpoints: between steps, with the hook-level state the engine does not see checked here too.
absl::Status CheckBetweenSteps(const strata_engine* e) {
  if (!e->finalized) return absl::FailedPreconditionError("called before strata_engine_finalize");
  if (e->in_micro_batch || e->micro_batches_done > 0 || e->open_uses > 0) {
    return absl::FailedPreconditionError("inside a step (a micro-batch or a unit is open, or micro-batches are "
                                         "waiting for strata_engine_step); call it between steps");
  }
  return absl::OkStatus();
}
}  // namespace strata::capi

using namespace strata::capi;  // NOLINT: the entry points below are thin wrappers

extern "C" {

strata_status strata_engine_create(strata_comm* comm, const strata_engine_options* options, strata_engine** out) {
  return Call(__func__, [&] { return CreateEngine(comm, options, out); });
}

strata_status strata_engine_register_unit(strata_engine* engine, const char* name, const strata_param_spec* params,
                                          int32_t num_params, int32_t* out_unit) {
  return Call(__func__, [&] { return RegisterUnit(engine, name, params, num_params, out_unit); });
}

strata_status strata_engine_finalize(strata_engine* engine) {
  return Call(__func__, [&] { return Finalize(engine); });
}

strata_status strata_engine_num_units(const strata_engine* engine, int32_t* out) {
  return Call(__func__, [&]() -> absl::Status {
    STRATA_RETURN_IF_ERROR(CheckEngine(engine));
    if (out == nullptr) return NullArgument("out");
    *out = engine->engine->num_units();
    return absl::OkStatus();
  });
}

strata_status strata_engine_num_params(const strata_engine* engine, int32_t unit, int32_t* out) {
  return Call(__func__, [&]() -> absl::Status {
    STRATA_RETURN_IF_ERROR(CheckRegisteredUnit(engine, unit));
    if (out == nullptr) return NullArgument("out");
    *out = static_cast<int32_t>(engine->engine->layout(unit).params.size());
    return absl::OkStatus();
  });
}

strata_status strata_engine_param_info(const strata_engine* engine, int32_t unit, int32_t param,
                                       strata_param_info* out) {
  return Call(__func__, [&] { return ParamInfo(engine, unit, param, out); });
}

strata_status strata_engine_gather_param(strata_engine* engine, int32_t unit, int32_t param, float* out,
                                         size_t count) {
  return Call(__func__, [&]() -> absl::Status {
    STRATA_RETURN_IF_ERROR(CheckTransfer(engine, unit, param, out, count, "out"));
    STRATA_ASSIGN_OR_RETURN(std::vector<float> full, engine->engine->GatherParam(unit, param));
    std::memcpy(out, full.data(), count * sizeof(float));
    return absl::OkStatus();
  });
}

strata_status strata_engine_set_param(strata_engine* engine, int32_t unit, int32_t param, const float* values,
                                      size_t count) {
  return Call(__func__, [&]() -> absl::Status {
    STRATA_RETURN_IF_ERROR(CheckTransfer(engine, unit, param, values, count, "values"));
    if (engine->in_micro_batch || engine->open_uses > 0) {
      return absl::FailedPreconditionError("inside a micro-batch or while a unit is begun; set parameters between "
                                           "steps");
    }
    STRATA_RETURN_IF_ERROR(CheckFinite(engine, unit, param, values, count, 0));
    return engine->engine->SetParam(unit, param, std::vector<float>(values, values + count));
  });
}

strata_status strata_engine_gather_unit(strata_engine* engine, int32_t unit, float* out, size_t count) {
  return Call(__func__, [&]() -> absl::Status {
    STRATA_RETURN_IF_ERROR(CheckFinalizedUnit(engine, unit));
    if (out == nullptr) return NullArgument("out");
    const size_t extent = ParamExtent(engine->engine->layout(unit));
    if (count != extent) {
      return absl::InvalidArgumentError(absl::StrCat("unit '", engine->engine->layout(unit).name, "' has ", extent,
                                                     " elements up to the end of its last parameter, count is ",
                                                     count));
    }
    STRATA_ASSIGN_OR_RETURN(std::vector<float> full, engine->engine->GatherUnit(unit));
    std::memcpy(out, full.data(), count * sizeof(float));
    return absl::OkStatus();
  });
}

strata_status strata_engine_held_range(const strata_engine* engine, int32_t unit, uint64_t* begin, uint64_t* end) {
  return Call(__func__, [&]() -> absl::Status {
    STRATA_RETURN_IF_ERROR(CheckFinalizedUnit(engine, unit));
    if (begin == nullptr) return NullArgument("begin");
    if (end == nullptr) return NullArgument("end");
    const auto [b, e] = engine->engine->HeldRange(unit);
    *begin = b;
    *end = e;
    return absl::OkStatus();
  });
}

strata_status strata_engine_set_param_range(strata_engine* engine, int32_t unit, int32_t param, uint64_t offset,
                                            const float* values, size_t count) {
  return Call(__func__, [&]() -> absl::Status {
    STRATA_RETURN_IF_ERROR(CheckFinalizedParam(engine, unit, param));
    if (values == nullptr && count > 0) return NullArgument("values");
    const strata::shard::ParamSlot& p = engine->engine->layout(unit).params[param];
    if (offset > p.numel || count > p.numel - offset) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", engine->engine->layout(unit).name, ".", p.spec.name,
                                                     "' has ", p.numel, " elements; [", offset, ", ", offset + count,
                                                     ") is not within it"));
    }
    if (engine->in_micro_batch || engine->open_uses > 0) {
      return absl::FailedPreconditionError(
          "inside a micro-batch or while a unit is begun; set parameters between steps");
    }
    STRATA_RETURN_IF_ERROR(CheckFinite(engine, unit, param, values, count, offset));
    return engine->engine->SetParamRange(unit, param, offset, values, count);
  });
}

strata_status strata_engine_save_checkpoint(strata_engine* engine, const char* root_dir, const char* trainer_json) {
  return Call(__func__, [&] { return SaveCheckpoint(engine, root_dir, trainer_json, /*async=*/false); });
}

strata_status strata_engine_save_checkpoint_async(strata_engine* engine, const char* root_dir,
                                                  const char* trainer_json) {
  return Call(__func__, [&] { return SaveCheckpoint(engine, root_dir, trainer_json, /*async=*/true); });
}

strata_status strata_engine_wait_checkpoint(strata_engine* engine) {
  return Call(__func__, [&]() -> absl::Status {
    STRATA_RETURN_IF_ERROR(CheckEngine(engine));
    return engine->engine->WaitCheckpoint();
  });
}

strata_status strata_engine_checkpoint_in_flight(const strata_engine* engine, int32_t* out) {
  return Call(__func__, [&]() -> absl::Status {
    STRATA_RETURN_IF_ERROR(CheckEngine(engine));
    if (out == nullptr) return NullArgument("out");
    *out = engine->engine->checkpoint_in_flight() ? 1 : 0;
    return absl::OkStatus();
  });
}

strata_status strata_engine_load_checkpoint(strata_engine* engine, const char* dir, const char** out_trainer_json) {
  return Call(__func__, [&] { return LoadCheckpoint(engine, dir, out_trainer_json); });
}

strata_status strata_engine_get_stats(const strata_engine* engine, strata_stats* out) {
  return Call(__func__, [&] { return GetStats(engine, out); });
}

strata_status strata_engine_reset_peak_memory(strata_engine* engine) {
  return Call(__func__, [&]() -> absl::Status {
    STRATA_RETURN_IF_ERROR(CheckEngine(engine));
    engine->engine->ResetPeakMemory();
    return absl::OkStatus();
  });
}

strata_status strata_engine_loss_scale(const strata_engine* engine, float* out) {
  return Call(__func__, [&]() -> absl::Status {
    STRATA_RETURN_IF_ERROR(CheckEngine(engine));
    if (out == nullptr) return NullArgument("out");
    *out = engine->engine->loss_scale();
    return absl::OkStatus();
  });
}

strata_status strata_engine_lr(const strata_engine* engine, double* out) {
  return Call(__func__, [&]() -> absl::Status {
    STRATA_RETURN_IF_ERROR(CheckEngine(engine));
    if (out == nullptr) return NullArgument("out");
    *out = engine->engine->next_lr();
    return absl::OkStatus();
  });
}

strata_status strata_engine_group_lr(const strata_engine* engine, int32_t has_own_lr, double own_lr, double* out) {
  return Call(__func__, [&]() -> absl::Status {
    STRATA_RETURN_IF_ERROR(CheckEngine(engine));
    if (out == nullptr) return NullArgument("out");
    if (has_own_lr != 0 && !(std::isfinite(own_lr) && own_lr >= 0)) {
      return absl::InvalidArgumentError(absl::StrCat("own_lr is ", own_lr, "; it must be finite and >= 0"));
    }
    *out = has_own_lr != 0 ? engine->engine->next_lr(own_lr) : engine->engine->next_lr();
    return absl::OkStatus();
  });
}

strata_status strata_engine_config_json(const strata_engine* engine, const char** out) {
  return Call(__func__, [&]() -> absl::Status {
    STRATA_RETURN_IF_ERROR(CheckEngine(engine));
    if (out == nullptr) return NullArgument("out");
    auto* e = const_cast<strata_engine*>(engine);  // the cached text only
    if (e->config_json.empty()) {
      nlohmann::json j = nlohmann::json::object();
      for (const auto& [key, value] : strata::engine::JobWideFields(e->engine->config())) j[key] = value;
      e->config_json = j.dump();
    }
    *out = e->config_json.c_str();
    return absl::OkStatus();
  });
}

strata_status strata_engine_destroy(strata_engine* engine) {
  return Call(__func__, [&]() -> absl::Status {
    if (engine == nullptr) return absl::OkStatus();
    STRATA_RETURN_IF_ERROR(CheckEngine(engine));
    engine->magic = 0;
    --engine->comm->live_engines;
    delete engine;  // the engine drains its streams before its buffers go
    return absl::OkStatus();
  });
}

}  // extern "C"
