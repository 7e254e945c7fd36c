// `strata train` options: the flags, the JSON config they override, and their validation.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/gpt/data/data.h"
#include "models/gpt/model/gpt_config.h"
#include "models/gpt/model/nn_backend.h"
#include "runtime/engine/config.h"
#include "spec/flags.h"

namespace strata::tools {

struct TrainOptions {
  gpt::GptConfig model;
  engine::EngineConfig engine;
  int64_t steps = 200;
  std::string data;  // "" = embedded corpus
  gpt::DataOrder order = gpt::DataOrder::kShuffled;
  std::string init_from, save_weights, metrics;
  std::string checkpoint_dir, resume;
  std::string trace;             // Chrome trace output
  int diagnostics_window = 20;   // steps; 0 = diagnostics off
  int64_t checkpoint_every = 0;  // steps; 0 = only at the end when --checkpoint-dir is set
  int64_t keep_last = 0;         // complete checkpoints kept; 0 = all
  bool checkpoint_async = false;  // --checkpoint-async: written in the background (Engine::SaveCheckpointAsync)
  bool checkpointing = false;
  std::string device = "auto";  // --device: cuda | host | auto (models/gpt/train/compute.h)
  // --matmul fp32 | tf32 | bf16 | auto (empty: bf16 when the parameters are bf16, else fp32; --tf32 =
  // tf32) and --attention auto | fused | reference: how the CUDA back-end computes (gpt::NnOptions).
  std::optional<gpt::Products> matmul;
  gpt::AttentionKind attention = gpt::AttentionKind::kAuto;
  int64_t print_every = 1;
  int64_t loader_delay_us = 0;        // test hook: slow the loader
  int64_t inject_nonfinite_step = -1;  // test hook: a NaN gradient on one rank at this step (0-based)
  int inject_nonfinite_rank = -1;
};

std::vector<spec::FlagDef> TrainFlagDefs();
absl::StatusOr<TrainOptions> ParseTrainOptions(const std::vector<std::string>& args, int world_size);

}  // namespace strata::tools
