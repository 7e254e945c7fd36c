// GPT-2 on the engine: token + position embeddings, pre-LayerNorm blocks (causal multi-head attention,
// GELU-tanh MLP, biases), a final LayerNorm and an LM head tied to the token embedding.
//
// Units: "embed" {wte.weight [V,C], wpe.weight [T,C]} used twice per pass (lookup, then the LM head),
// "h.{i}" one per block with Hugging Face's parameter names and Conv1D layouts ([in, out]), and "ln_f".
// Weight decay applies to the 2-D matrices (embeddings included), not to biases or LayerNorm, unless the
// engine's strata.weight_decay_1d says every parameter decays (DeepSpeed's rule, a JSON config's default).
// Forward and backward are hand-written over an NnBackend (models/gpt/nn/cpu/nn.h, or their CUDA twins); with
// activation checkpointing each block keeps only its input and recomputes its forward inside its backward
// use (same gradients).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/gpt/model/gpt_config.h"
#include "models/gpt/model/nn_backend.h"
#include "runtime/engine/engine.h"

namespace strata::gpt {

struct HfParam {
  int unit;
  int param;
  std::string name;  // Hugging Face GPT-2 tensor name, e.g. "h.3.attn.c_attn.weight"
  std::vector<int64_t> shape;
};

// The Hugging Face name of a registered (unit, parameter): "wte.weight" for the embed unit's, else
// "<unit>.<param>" ("h.3.attn.c_attn.weight", "ln_f.weight").
std::string HfName(const std::string& unit, const std::string& param);

struct Workspace;  // activations and scratch of one micro-batch shape (gpt_model.cc)

// The units GptModel::Register registers, in order: "embed", "h.0" ... "h.{L-1}", "ln_f" (what `strata
// plan` lays out without an engine).
struct UnitSpec {
  std::string name;
  std::vector<shard::ParamSpec> params;
};
std::vector<UnitSpec> UnitSpecs(const GptConfig& cfg);
// Floats of the fp32 copy of the unit in use that the model keeps with low-precision parameters (0 with fp32).
size_t UnitCopyFloats(DType param_dtype, size_t largest_unit_elems);
// Bytes of the activations and scratch of one micro-batch of B sequences of T tokens, with the attention
// buffers `att` (NnBackend::PrepareAttention's answer): what TrainMicroBatch's workspace allocates.
uint64_t WorkspaceBytes(const GptConfig& cfg, int B, int T, bool recompute, const AttentionBuffers& att);

// The loss came out NaN or infinite although every token is inside the vocabulary (checked first, on the
// host): training diverged (too high a learning rate, fp16 overflow in forward, ...). The status that
// TrainMicroBatch / Forward return then answers true here; a token outside the vocabulary is a different,
// InvalidArgument error naming the token and its position.
bool IsDivergence(const absl::Status& status);

class GptModel {
 public:
  // `nn`: where forward and backward run (nullptr: the host kernels). A CUDA back-end needs an engine on
  // the same GPU (its parameters and gradients are device memory).
  static absl::StatusOr<GptModel> Register(engine::Engine& e, const GptConfig& cfg,
                                           std::unique_ptr<NnBackend> nn = nullptr);
  GptModel(GptModel&&) noexcept;
  GptModel& operator=(GptModel&&) noexcept;
  ~GptModel();

  // One micro-batch of B sequences of cfg.seq_len tokens: forward, loss, backward through the engine's
  // hooks. `loss_scale` multiplies the loss gradient (fp16 loss scaling; 1 otherwise). Returns the
  // micro-batch's mean loss. Every input and target must lie in [0, vocab) (else InvalidArgument); a
  // non-finite loss is an IsDivergence error.
  absl::StatusOr<double> TrainMicroBatch(engine::Engine& e, const int32_t* inputs, const int32_t* targets, int B,
                                         float loss_scale, bool checkpointing);

  // Forward only, outside a micro-batch (evaluation / generation), on B sequences of T <= seq_len tokens.
  // Returns the mean loss when targets != nullptr (else 0); fills the logits of `position` (default
  // T-1) of sequence 0 into *logits when non-null.
  absl::StatusOr<double> Forward(engine::Engine& e, const int32_t* inputs, const int32_t* targets, int B, int T,
                                 std::vector<float>* logits, int position = -1);

  const GptConfig& config() const { return cfg_; }
  const std::vector<HfParam>& hf_params() const { return hf_; }
  const NnBackend& nn() const { return *nn_; }
  // Bytes the workspace of the last micro-batch shape holds (0 before the first), as allocated.
  uint64_t workspace_bytes() const;

 private:
  GptModel() = default;
  GptConfig cfg_;
  int embed_ = -1, ln_f_ = -1;
  std::vector<int> blocks_;
  std::vector<HfParam> hf_;
  std::unique_ptr<Workspace> ws_;
  std::unique_ptr<NnBackend> nn_;
  std::shared_ptr<float> unit_f32_;  // fp32 copy of the unit in use when the param dtype is not fp32

  friend struct Pass;
};

}  // namespace strata::gpt
