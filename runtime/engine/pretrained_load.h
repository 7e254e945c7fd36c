// Loading pretrained weights into an engine's shards by byte ranges (Note [Pretrained by byte ranges] in
// runtime/checkpoint/pretrained.h; docs/decisions/0037-pretrained-by-byte-ranges.md). A free function over the
// engine's public surface (HeldRange, SetParamRanges): the reading is runtime/checkpoint's, the I/O offload's.
#pragma once

#include <cstddef>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "runtime/checkpoint/pretrained.h"
#include "runtime/engine/engine.h"

namespace strata::engine {

// Parameter (unit, param) takes the values of tensor `tensor` of the checkpoint (an index into tensors()): all of
// them (piece false: the element counts are equal), or, for a piece, the elements [at, at + the tensor's count)
// (a parameter that a checkpoint stores as several tensors, as transformers' stacked experts).
struct PretrainedTarget {
  int unit = 0;
  int param = 0;
  size_t tensor = 0;
  bool piece = false;
  uint64_t at = 0;
};

// After finalize, between steps; not collective. For each target, reads only the elements of the tensor this
// rank keeps of the parameter (Engine::HeldRange: about 1/world_size at stage 3, all at stages 0-2), converts
// them to fp32 and writes them unit by unit: one unit's values are staged in host memory and written with one
// Engine::SetParamRanges, so each unit's master and parameter storage are written once (Note [Unit-at-once
// writes] in engine.cc, decision 0043). Refused before any I/O: a unit or parameter that does not exist, a
// tensor whose element count is not the parameter's (a piece: one reaching past its end), a dtype other than
// F32/BF16/F16 (each naming the file, the tensor and the parameter). A value that is not finite is
// InvalidArgument naming the tensor and its index; units written before an error keep their new values, the
// unit being read keeps its old ones.
absl::StatusOr<checkpoint::RangeReadStats> LoadPretrained(Engine& engine,
                                                          const checkpoint::PretrainedCheckpoint& checkpoint,
                                                          absl::Span<const PretrainedTarget> targets,
                                                          const checkpoint::RangeReadOptions& options);

}  // namespace strata::engine
