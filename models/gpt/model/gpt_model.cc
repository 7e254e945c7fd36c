// GPT-2 registration, parameter access and the forward / backward passes over the engine's hooks.
#include "models/gpt/model/gpt_model.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "kernels/common/element_math.h"
#include "runtime/base/status.h"

namespace strata::gpt {

using engine::Engine;
using shard::Init;
using shard::ParamSpec;

// Block parameter indices, in registration order.
enum BlockParam { kLn1W, kLn1B, kAttnW, kAttnB, kProjW, kProjB, kLn2W, kLn2B, kFcW, kFcB, kFcProjW, kFcProjB };

struct LayerActs {
  float *ln1, *mean1, *rstd1, *qkv, *att, *atty, *xmid, *ln2, *mean2, *rstd2, *fc, *gelu;
};

// Activations and scratch of one micro-batch shape, in the back-end's memory.
struct Workspace {
  int B = 0, T = 0;
  bool recompute = false;
  std::vector<std::shared_ptr<float>> storage;
  std::shared_ptr<int32_t> token_storage;
  std::vector<float*> x;        // residual stream entering block l (x[L] leaves the last block)
  std::vector<LayerActs> acts;  // per block, or one reused slot with recomputation
  float *lnf, *meanf, *rstdf, *probs, *losses;
  float *dres, *dln, *dqkv, *datt, *datty, *dfc, *dgelu, *dlogits;
  int32_t *inputs, *targets;  // the micro-batch's tokens, copied in
  uint64_t bytes = 0;         // what Prepare allocated
};

namespace {

// Note [Divergence]: the status payload that marks a non-finite loss, so callers can tell it from bad data.
constexpr char kDivergencePayload[] = "strata.gpt/divergence";

absl::Status DivergenceError(double loss) {
  absl::Status s = absl::InternalError(
      absl::StrCat("the loss is ", loss, " (not finite) although every target token is inside the vocabulary: "
                   "training diverged"));
  s.SetPayload(kDivergencePayload, absl::Cord("1"));
  return s;
}

// The kernels index a micro-batch's B x T token rows with an int.
absl::Status CheckBatch(int B, int T) {
  if (B < 1 || int64_t{B} * T > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("a micro-batch of ", B, " sequences of ", T,
                                                   " tokens: it must hold 1 to 2147483647 tokens"));
  }
  return absl::OkStatus();
}

// Every token in [0, vocab): an id outside would read past the embedding table or the logits.
absl::Status CheckTokens(const int32_t* tokens, size_t n, int vocab, const char* what) {
  for (size_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(what, " token is outside the vocabulary: token ", tokens[i],
                                                     " at position ", i, ", vocabulary of ", vocab));
    }
  }
  return absl::OkStatus();
}

// Lays out the activations and scratch of one micro-batch shape: `floats(n)` and `ints(n)` hand out n
// elements each. Prepare allocates through it; WorkspaceBytes counts through it (nothing is allocated
// then, and the pointers are never read), so the bytes `strata plan` reports are the ones Prepare takes.
template <typename Floats, typename Ints>
absl::Status LayOut(Workspace& w, const GptConfig& c, int B, int T, bool recompute, const AttentionBuffers& att,
                    Floats floats, Ints ints) {
  const size_t N = size_t(B) * T, C = c.d_model, V = c.vocab;
  for (int l = 0; l <= c.layers; ++l) {
    STRATA_ASSIGN_OR_RETURN(float* x, floats(N * C));
    w.x.push_back(x);
  }
  w.acts.resize(recompute ? 1 : c.layers);
  for (LayerActs& a : w.acts) {
    for (float** v : {&a.ln1, &a.atty, &a.xmid, &a.ln2}) {
      STRATA_ASSIGN_OR_RETURN(*v, floats(N * C));
    }
    for (float** v : {&a.mean1, &a.rstd1, &a.mean2, &a.rstd2}) {
      STRATA_ASSIGN_OR_RETURN(*v, floats(N));
    }
    STRATA_ASSIGN_OR_RETURN(a.qkv, floats(N * 3 * C));
    STRATA_ASSIGN_OR_RETURN(a.att, floats(att.saved_floats));
    STRATA_ASSIGN_OR_RETURN(a.fc, floats(N * 4 * C));
    STRATA_ASSIGN_OR_RETURN(a.gelu, floats(N * 4 * C));
  }
  for (float** v : {&w.lnf, &w.dres, &w.dln, &w.datty}) {
    STRATA_ASSIGN_OR_RETURN(*v, floats(N * C));
  }
  for (float** v : {&w.meanf, &w.rstdf, &w.losses}) {
    STRATA_ASSIGN_OR_RETURN(*v, floats(N));
  }
  STRATA_ASSIGN_OR_RETURN(w.probs, floats(N * V));
  STRATA_ASSIGN_OR_RETURN(w.dlogits, floats(N * V));
  STRATA_ASSIGN_OR_RETURN(w.dqkv, floats(N * 3 * C));
  STRATA_ASSIGN_OR_RETURN(w.datt, floats(att.scratch_floats));
  STRATA_ASSIGN_OR_RETURN(w.dfc, floats(N * 4 * C));
  STRATA_ASSIGN_OR_RETURN(w.dgelu, floats(N * 4 * C));
  STRATA_ASSIGN_OR_RETURN(w.inputs, ints(2 * N));  // inputs, then targets (Prepare points at them)
  return absl::OkStatus();
}

absl::Status Prepare(Workspace& w, NnBackend& nn, const GptConfig& c, int B, int T, bool recompute) {
  if (w.B == B && w.T == T && w.recompute == recompute) return absl::OkStatus();
  STRATA_ASSIGN_OR_RETURN(const AttentionBuffers att, nn.PrepareAttention(B, T, c.d_model, c.heads));
  w = Workspace{};
  auto floats = [&](size_t n) -> absl::StatusOr<float*> {
    STRATA_ASSIGN_OR_RETURN(std::shared_ptr<float> p, nn.AllocFloats(n));
    w.storage.push_back(p);
    w.bytes += n * sizeof(float);
    return p.get();
  };
  auto ints = [&](size_t n) -> absl::StatusOr<int32_t*> {
    STRATA_ASSIGN_OR_RETURN(w.token_storage, nn.AllocInts(n));
    w.bytes += n * sizeof(int32_t);
    return w.token_storage.get();
  };
  STRATA_RETURN_IF_ERROR(LayOut(w, c, B, T, recompute, att, floats, ints));
  w.targets = w.inputs + size_t(B) * T;
  w.B = B;
  w.T = T;
  w.recompute = recompute;
  return absl::OkStatus();
}

std::vector<ParamSpec> BlockSpecs(const GptConfig& c) {
  const int64_t C = c.d_model;
  const float std = 0.02f, proj_std = 0.02f / std::sqrt(2.0f * c.layers);
  return {ParamSpec{"ln_1.weight", {C}, false, Init::Ones()},
          ParamSpec{"ln_1.bias", {C}, false, Init::Zeros()},
          ParamSpec{"attn.c_attn.weight", {C, 3 * C}, true, Init::Normal(std)},
          ParamSpec{"attn.c_attn.bias", {3 * C}, false, Init::Zeros()},
          ParamSpec{"attn.c_proj.weight", {C, C}, true, Init::Normal(proj_std)},
          ParamSpec{"attn.c_proj.bias", {C}, false, Init::Zeros()},
          ParamSpec{"ln_2.weight", {C}, false, Init::Ones()},
          ParamSpec{"ln_2.bias", {C}, false, Init::Zeros()},
          ParamSpec{"mlp.c_fc.weight", {C, 4 * C}, true, Init::Normal(std)},
          ParamSpec{"mlp.c_fc.bias", {4 * C}, false, Init::Zeros()},
          ParamSpec{"mlp.c_proj.weight", {4 * C, C}, true, Init::Normal(proj_std)},
          ParamSpec{"mlp.c_proj.bias", {C}, false, Init::Zeros()}};
}

}  // namespace

std::vector<UnitSpec> UnitSpecs(const GptConfig& cfg) {
  const int64_t C = cfg.d_model;
  std::vector<UnitSpec> units;
  units.push_back({"embed", {ParamSpec{"wte.weight", {cfg.vocab, C}, true, Init::Normal(0.02f)},
                             ParamSpec{"wpe.weight", {cfg.seq_len, C}, true, Init::Normal(0.01f)}}});
  for (int l = 0; l < cfg.layers; ++l) units.push_back({absl::StrCat("h.", l), BlockSpecs(cfg)});
  units.push_back(
      {"ln_f", {ParamSpec{"weight", {C}, false, Init::Ones()}, ParamSpec{"bias", {C}, false, Init::Zeros()}}});
  return units;
}

size_t UnitCopyFloats(DType param_dtype, size_t largest_unit_elems) {
  return param_dtype == DType::kF32 ? 0 : largest_unit_elems;
}

uint64_t WorkspaceBytes(const GptConfig& cfg, int B, int T, bool recompute, const AttentionBuffers& att) {
  Workspace w;
  uint64_t bytes = 0;
  // Distinct non-null stand-ins: LayOut stores them and never reads through them.
  static float float_stand_in;
  static int32_t int_stand_in;
  auto floats = [&](size_t n) -> absl::StatusOr<float*> {
    bytes += n * sizeof(float);
    return &float_stand_in;
  };
  auto ints = [&](size_t n) -> absl::StatusOr<int32_t*> {
    bytes += n * sizeof(int32_t);
    return &int_stand_in;
  };
  LayOut(w, cfg, B, T, recompute, att, floats, ints).IgnoreError();  // the counting allocators never fail
  return bytes;
}

uint64_t GptModel::workspace_bytes() const { return ws_ == nullptr ? 0 : ws_->bytes; }

bool IsDivergence(const absl::Status& status) { return status.GetPayload(kDivergencePayload).has_value(); }

std::string HfName(const std::string& unit, const std::string& param) {
  // Registered names are the HF names without the unit prefix; the embed unit's already are whole.
  return unit == "embed" ? param : absl::StrCat(unit, ".", param);
}

GptModel::GptModel(GptModel&&) noexcept = default;
GptModel& GptModel::operator=(GptModel&&) noexcept = default;
GptModel::~GptModel() = default;

absl::StatusOr<GptModel> GptModel::Register(Engine& e, const GptConfig& cfg, std::unique_ptr<NnBackend> nn) {
  STRATA_RETURN_IF_ERROR(Validate(cfg));
  GptModel m;
  m.cfg_ = cfg;
  m.ws_ = std::make_unique<Workspace>();
  m.nn_ = nn != nullptr ? std::move(nn) : MakeHostNn();
  // UnitSpecs' order: the embeddings, the blocks, the final LayerNorm.
  std::vector<UnitSpec> units = UnitSpecs(cfg);
  for (size_t i = 0; i < units.size(); ++i) {
    // strata.weight_decay_1d (DeepSpeed's rule, the JSON default): the biases and LayerNorms decay too.
    for (ParamSpec& p : units[i].params) p.weight_decay = p.weight_decay || e.config().weight_decay_1d;
    STRATA_ASSIGN_OR_RETURN(int id, e.RegisterUnit(std::move(units[i].name), std::move(units[i].params)));
    if (i == 0) m.embed_ = id;
    else if (i + 1 == units.size()) m.ln_f_ = id;
    else m.blocks_.push_back(id);
  }
  size_t largest = 0;
  for (int u = 0; u <= m.ln_f_; ++u) {
    largest = std::max(largest, e.layout(u).total_elems);
    for (int p = 0; p < static_cast<int>(e.layout(u).params.size()); ++p) {
      const auto& spec = e.layout(u).params[p].spec;
      m.hf_.push_back(HfParam{u, p, HfName(e.layout(u).name, spec.name), spec.shape});
    }
  }
  if (const size_t n = UnitCopyFloats(e.config().param_dtype, largest); n > 0) {  // Pass::Begin's copy
    STRATA_ASSIGN_OR_RETURN(m.unit_f32_, m.nn_->AllocFloats(n));
  }
  return m;
}

// One pass over the model: parameter access through the hooks, and the block / head computations.
struct Pass {
  GptModel& m;
  Engine& e;
  Workspace& w;
  NnBackend& nn;
  int B, T;

  size_t N() const { return size_t(B) * T; }
  int C() const { return m.cfg_.d_model; }

  // Begins a use of `unit`; with a low-precision param dtype, converts the unit's gathered parameters to
  // fp32 once for this use.
  absl::Status Begin(int unit, bool backward) {
    STRATA_RETURN_IF_ERROR(backward ? e.BeginBackward(unit) : e.BeginForward(unit));
    const DType dt = e.config().param_dtype;
    if (dt == DType::kF32) return absl::OkStatus();
    const auto& layout = e.layout(unit);
    for (size_t p = 0; p < layout.params.size(); ++p) {
      const engine::ParamView v = e.Param(unit, static_cast<int>(p));
      nn.Widen(static_cast<const uint16_t*>(v.data), dt, m.unit_f32_.get() + layout.params[p].offset_elems, v.numel);
    }
    return absl::OkStatus();
  }
  // Ends a use of `unit` once the back-end finished its work (the engine may release or reduce then).
  absl::Status End(int unit, bool backward) {
    STRATA_RETURN_IF_ERROR(nn.Sync());
    return backward ? e.EndBackward(unit) : e.EndForward(unit);
  }
  const float* W(int unit, int param) const {
    if (e.config().param_dtype == DType::kF32) return e.Param(unit, param).f32();
    return m.unit_f32_.get() + e.layout(unit).params[param].offset_elems;
  }
  float* G(int unit, int param) const { return e.Grad(unit, param); }

  void BlockForward(int unit, const float* xin, LayerActs& a, float* xout) {
    const int C = this->C(), NH = m.cfg_.heads;
    const int n = static_cast<int>(N());
    nn.LayerNormForward(xin, W(unit, kLn1W), W(unit, kLn1B), a.ln1, a.mean1, a.rstd1, n, C);
    nn.MatmulForward(a.ln1, W(unit, kAttnW), W(unit, kAttnB), a.qkv, n, C, 3 * C);
    nn.AttentionForward(a.qkv, a.atty, a.att, B, T, C, NH);
    nn.MatmulForward(a.atty, W(unit, kProjW), W(unit, kProjB), a.xmid, n, C, C);
    nn.AddInto(a.xmid, xin, N() * C);
    nn.LayerNormForward(a.xmid, W(unit, kLn2W), W(unit, kLn2B), a.ln2, a.mean2, a.rstd2,
                         n, C);
    nn.MatmulForward(a.ln2, W(unit, kFcW), W(unit, kFcB), a.fc, n, C, 4 * C);
    nn.GeluForward(a.fc, a.gelu, N() * 4 * C);
    nn.MatmulForward(a.gelu, W(unit, kFcProjW), W(unit, kFcProjB), xout, n, 4 * C, C);
    nn.AddInto(xout, a.xmid, N() * C);
  }

  // w.dres holds d(block output) on entry and d(block input) on exit.
  void BlockBackward(int unit, const float* xin, LayerActs& a) {
    const int C = this->C(), NH = m.cfg_.heads;
    const int n = static_cast<int>(N());
    nn.MatmulBackward(w.dres, a.gelu, W(unit, kFcProjW), w.dgelu, G(unit, kFcProjW),
                       G(unit, kFcProjB), n, 4 * C, C);
    nn.GeluBackward(a.fc, w.dgelu, w.dfc, N() * 4 * C);
    nn.MatmulBackward(w.dfc, a.ln2, W(unit, kFcW), w.dln, G(unit, kFcW), G(unit, kFcB), n, C,
                       4 * C);
    nn.LayerNormBackward(w.dln, a.xmid, W(unit, kLn2W), a.mean2, a.rstd2, w.dres,
                          G(unit, kLn2W), G(unit, kLn2B), n, C);
    nn.MatmulBackward(w.dres, a.atty, W(unit, kProjW), w.datty, G(unit, kProjW),
                       G(unit, kProjB), n, C, C);
    nn.AttentionBackward(w.datty, a.qkv, a.att, w.dqkv, w.datt, B, T, C, NH);
    nn.MatmulBackward(w.dqkv, a.ln1, W(unit, kAttnW), w.dln, G(unit, kAttnW), G(unit, kAttnB),
                       n, C, 3 * C);
    nn.LayerNormBackward(w.dln, xin, W(unit, kLn1W), a.mean1, a.rstd1, w.dres,
                          G(unit, kLn1W), G(unit, kLn1B), n, C);
  }

  // Embedding lookup, the blocks, the final LayerNorm, and the tied head with the loss (when targets).
  // `has_targets`: w.targets holds the targets (else no loss).
  absl::StatusOr<double> Forward(bool has_targets, std::vector<float>* logits, int position) {
    const int32_t* inputs = w.inputs;
    const int C = this->C(), V = m.cfg_.vocab;
    STRATA_RETURN_IF_ERROR(Begin(m.embed_, false));
    nn.EmbeddingForward(inputs, W(m.embed_, 0), W(m.embed_, 1), w.x[0], B, T, C);
    STRATA_RETURN_IF_ERROR(End(m.embed_, false));
    for (int l = 0; l < m.cfg_.layers; ++l) {
      STRATA_RETURN_IF_ERROR(Begin(m.blocks_[l], false));
      BlockForward(m.blocks_[l], w.x[l], w.acts[w.recompute ? 0 : l], w.x[l + 1]);
      STRATA_RETURN_IF_ERROR(End(m.blocks_[l], false));
    }
    STRATA_RETURN_IF_ERROR(Begin(m.ln_f_, false));
    nn.LayerNormForward(w.x[m.cfg_.layers], W(m.ln_f_, 0), W(m.ln_f_, 1), w.lnf, w.meanf,
                         w.rstdf, static_cast<int>(N()), C);
    STRATA_RETURN_IF_ERROR(End(m.ln_f_, false));
    STRATA_RETURN_IF_ERROR(Begin(m.embed_, false));
    nn.MatmulTransBForward(w.lnf, W(m.embed_, 0), w.dlogits, static_cast<int>(N()), C, V);
    STRATA_RETURN_IF_ERROR(End(m.embed_, false));
    if (logits != nullptr) {
      logits->resize(V);
      STRATA_RETURN_IF_ERROR(nn.CopyOut(logits->data(), w.dlogits + size_t(position) * V, V));
    }
    if (!has_targets) return 0.0;
    STRATA_ASSIGN_OR_RETURN(const double loss,
                            nn.CrossEntropyForward(w.dlogits, w.targets, w.probs, w.losses, static_cast<int>(N()), V));
    if (!std::isfinite(loss)) return DivergenceError(loss);
    return loss;
  }

  absl::Status Backward(float loss_scale) {
    const int32_t *inputs = w.inputs, *targets = w.targets;
    const int C = this->C(), V = m.cfg_.vocab, L = m.cfg_.layers;
    const int n = static_cast<int>(N());
    nn.CrossEntropyBackward(w.probs, targets, w.dlogits, loss_scale / static_cast<float>(N()), n, V);
    STRATA_RETURN_IF_ERROR(Begin(m.embed_, true));
    nn.MatmulTransBBackward(w.dlogits, w.lnf, W(m.embed_, 0), w.dln, G(m.embed_, 0), n, C, V);
    STRATA_RETURN_IF_ERROR(End(m.embed_, true));
    STRATA_RETURN_IF_ERROR(Begin(m.ln_f_, true));
    nn.Zero(w.dres, N() * C);
    nn.LayerNormBackward(w.dln, w.x[L], W(m.ln_f_, 0), w.meanf, w.rstdf, w.dres,
                          G(m.ln_f_, 0), G(m.ln_f_, 1), n, C);
    STRATA_RETURN_IF_ERROR(End(m.ln_f_, true));
    for (int l = L - 1; l >= 0; --l) {
      STRATA_RETURN_IF_ERROR(Begin(m.blocks_[l], true));
      LayerActs& a = w.acts[w.recompute ? 0 : l];
      if (w.recompute) {
        // Activation checkpointing: rebuild this block's activations from its saved input. The output it
        // rewrites into x[l+1] is bit-identical to the forward's (same operations, same order).
        BlockForward(m.blocks_[l], w.x[l], a, w.x[l + 1]);
      }
      BlockBackward(m.blocks_[l], w.x[l], a);
      STRATA_RETURN_IF_ERROR(End(m.blocks_[l], true));
    }
    STRATA_RETURN_IF_ERROR(Begin(m.embed_, true));
    nn.EmbeddingBackward(w.dres, inputs, G(m.embed_, 0), G(m.embed_, 1), B, T, C);
    return End(m.embed_, true);
  }
};

absl::StatusOr<double> GptModel::TrainMicroBatch(Engine& e, const int32_t* inputs, const int32_t* targets, int B,
                                                 float loss_scale, bool checkpointing) {
  STRATA_RETURN_IF_ERROR(CheckBatch(B, cfg_.seq_len));
  STRATA_RETURN_IF_ERROR(CheckTokens(inputs, size_t(B) * cfg_.seq_len, cfg_.vocab, "an input"));
  STRATA_RETURN_IF_ERROR(CheckTokens(targets, size_t(B) * cfg_.seq_len, cfg_.vocab, "a target"));
  STRATA_RETURN_IF_ERROR(Prepare(*ws_, *nn_, cfg_, B, cfg_.seq_len, checkpointing));
  const size_t n = size_t(B) * cfg_.seq_len;
  nn_->CopyIn(ws_->inputs, inputs, n);
  nn_->CopyIn(ws_->targets, targets, n);
  Pass pass{*this, e, *ws_, *nn_, B, cfg_.seq_len};
  STRATA_ASSIGN_OR_RETURN(double loss, pass.Forward(/*has_targets=*/true, nullptr, 0));
  STRATA_RETURN_IF_ERROR(pass.Backward(loss_scale));
  return loss;
}

absl::StatusOr<double> GptModel::Forward(Engine& e, const int32_t* inputs, const int32_t* targets, int B, int T,
                                         std::vector<float>* logits, int position) {
  if (T < 1 || T > cfg_.seq_len) {
    return absl::InvalidArgumentError(absl::StrCat("sequence of ", T, " tokens; the model takes 1 to ", cfg_.seq_len));
  }
  if (position >= T) return absl::InvalidArgumentError(absl::StrCat("logits position ", position, " >= T=", T));
  STRATA_RETURN_IF_ERROR(CheckBatch(B, T));
  STRATA_RETURN_IF_ERROR(CheckTokens(inputs, size_t(B) * T, cfg_.vocab, "an input"));
  if (targets != nullptr) STRATA_RETURN_IF_ERROR(CheckTokens(targets, size_t(B) * T, cfg_.vocab, "a target"));
  STRATA_RETURN_IF_ERROR(Prepare(*ws_, *nn_, cfg_, B, T, /*recompute=*/true));
  nn_->CopyIn(ws_->inputs, inputs, size_t(B) * T);
  if (targets != nullptr) nn_->CopyIn(ws_->targets, targets, size_t(B) * T);
  Pass pass{*this, e, *ws_, *nn_, B, T};
  return pass.Forward(targets != nullptr, logits, position < 0 ? T - 1 : position);
}

}  // namespace strata::gpt
