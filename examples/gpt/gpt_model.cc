// GPT-2 registration, parameter access and the forward / backward passes over the engine's hooks.
#include "examples/gpt/gpt_model.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/common/element_math.h"
#include "kernels/cpu/nn.h"
#include "runtime/base/status.h"

namespace strata::gpt {

namespace nn = kernels::cpu;
using engine::Engine;
using shard::Init;
using shard::ParamSpec;

// Block parameter indices, in registration order.
enum BlockParam { kLn1W, kLn1B, kAttnW, kAttnB, kProjW, kProjB, kLn2W, kLn2B, kFcW, kFcB, kFcProjW, kFcProjB };

struct LayerActs {
  std::vector<float> ln1, mean1, rstd1, qkv, att, atty, xmid, ln2, mean2, rstd2, fc, gelu;
};

struct Workspace {
  int B = 0, T = 0;
  bool recompute = false;
  std::vector<std::vector<float>> x;  // residual stream entering block l (x[L] leaves the last block)
  std::vector<LayerActs> acts;         // per block, or one reused slot with recomputation
  std::vector<float> lnf, meanf, rstdf, probs, losses;
  std::vector<float> dres, dln, dqkv, datt, datty, dfc, dgelu, dlogits;
};

namespace {

void SizeActs(LayerActs& a, size_t N, size_t C, size_t BHTT) {
  for (auto* v : {&a.ln1, &a.atty, &a.xmid, &a.ln2}) v->resize(N * C);
  for (auto* v : {&a.mean1, &a.rstd1, &a.mean2, &a.rstd2}) v->resize(N);
  a.qkv.resize(N * 3 * C);
  a.att.resize(BHTT);
  a.fc.resize(N * 4 * C);
  a.gelu.resize(N * 4 * C);
}

void Prepare(Workspace& w, const GptConfig& c, int B, int T, bool recompute) {
  if (w.B == B && w.T == T && w.recompute == recompute) return;
  const size_t N = size_t(B) * T, C = c.d_model, BHTT = size_t(B) * c.heads * T * T, V = c.vocab;
  w.B = B;
  w.T = T;
  w.recompute = recompute;
  w.x.assign(c.layers + 1, std::vector<float>(N * C));
  w.acts.assign(recompute ? 1 : c.layers, LayerActs{});
  for (auto& a : w.acts) SizeActs(a, N, C, BHTT);
  w.lnf.resize(N * C);
  w.meanf.resize(N);
  w.rstdf.resize(N);
  w.probs.resize(N * V);
  w.losses.resize(N);
  w.dres.resize(N * C);
  w.dln.resize(N * C);
  w.datty.resize(N * C);
  w.dqkv.resize(N * 3 * C);
  w.datt.resize(BHTT);
  w.dfc.resize(N * 4 * C);
  w.dgelu.resize(N * 4 * C);
  w.dlogits.resize(N * V);
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

std::string HfName(const std::string& unit, const std::string& param) {
  // Registered names are the HF names without the unit prefix; the embed unit's already are whole.
  return unit == "embed" ? param : absl::StrCat(unit, ".", param);
}

GptModel::GptModel(GptModel&&) noexcept = default;
GptModel& GptModel::operator=(GptModel&&) noexcept = default;
GptModel::~GptModel() = default;

absl::StatusOr<GptModel> GptModel::Register(Engine& e, const GptConfig& cfg) {
  STRATA_RETURN_IF_ERROR(Validate(cfg));
  GptModel m;
  m.cfg_ = cfg;
  m.ws_ = std::make_unique<Workspace>();
  const int64_t C = cfg.d_model;
  STRATA_ASSIGN_OR_RETURN(m.embed_, e.RegisterUnit("embed", {ParamSpec{"wte.weight", {cfg.vocab, C}, true, Init::Normal(0.02f)},
                                                             ParamSpec{"wpe.weight", {cfg.seq_len, C}, true, Init::Normal(0.01f)}}));
  for (int l = 0; l < cfg.layers; ++l) {
    STRATA_ASSIGN_OR_RETURN(int id, e.RegisterUnit(absl::StrCat("h.", l), BlockSpecs(cfg)));
    m.blocks_.push_back(id);
  }
  STRATA_ASSIGN_OR_RETURN(m.ln_f_, e.RegisterUnit("ln_f", {ParamSpec{"weight", {C}, false, Init::Ones()},
                                                           ParamSpec{"bias", {C}, false, Init::Zeros()}}));
  for (int u = 0; u <= m.ln_f_; ++u) {
    for (int p = 0; p < static_cast<int>(e.layout(u).params.size()); ++p) {
      const auto& spec = e.layout(u).params[p].spec;
      m.hf_.push_back(HfParam{u, p, HfName(e.layout(u).name, spec.name), spec.shape});
    }
  }
  return m;
}

// One pass over the model: parameter access through the hooks, and the block / head computations.
struct Pass {
  GptModel& m;
  Engine& e;
  Workspace& w;
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
    m.unit_f32_.resize(layout.total_elems);
    for (size_t p = 0; p < layout.params.size(); ++p) {
      const engine::ParamView v = e.Param(unit, static_cast<int>(p));
      const uint16_t* src = static_cast<const uint16_t*>(v.data);
      float* dst = m.unit_f32_.data() + layout.params[p].offset_elems;
      for (size_t i = 0; i < v.numel; ++i) {
        dst[i] = dt == DType::kBF16 ? kernels::Bf16ToFloat(src[i]) : kernels::HalfToFloat(src[i]);
      }
    }
    return absl::OkStatus();
  }
  const float* W(int unit, int param) const {
    if (e.config().param_dtype == DType::kF32) return e.Param(unit, param).f32();
    return m.unit_f32_.data() + e.layout(unit).params[param].offset_elems;
  }
  float* G(int unit, int param) const { return e.Grad(unit, param); }

  void BlockForward(int unit, const float* xin, LayerActs& a, float* xout) {
    const int C = this->C(), NH = m.cfg_.heads;
    const int n = static_cast<int>(N());
    nn::LayerNormForward(xin, W(unit, kLn1W), W(unit, kLn1B), a.ln1.data(), a.mean1.data(), a.rstd1.data(), n, C);
    nn::MatmulForward(a.ln1.data(), W(unit, kAttnW), W(unit, kAttnB), a.qkv.data(), n, C, 3 * C);
    nn::AttentionForward(a.qkv.data(), a.atty.data(), a.att.data(), B, T, C, NH);
    nn::MatmulForward(a.atty.data(), W(unit, kProjW), W(unit, kProjB), a.xmid.data(), n, C, C);
    nn::AddInto(a.xmid.data(), xin, N() * C);
    nn::LayerNormForward(a.xmid.data(), W(unit, kLn2W), W(unit, kLn2B), a.ln2.data(), a.mean2.data(), a.rstd2.data(),
                         n, C);
    nn::MatmulForward(a.ln2.data(), W(unit, kFcW), W(unit, kFcB), a.fc.data(), n, C, 4 * C);
    nn::GeluForward(a.fc.data(), a.gelu.data(), N() * 4 * C);
    nn::MatmulForward(a.gelu.data(), W(unit, kFcProjW), W(unit, kFcProjB), xout, n, 4 * C, C);
    nn::AddInto(xout, a.xmid.data(), N() * C);
  }

  // w.dres holds d(block output) on entry and d(block input) on exit.
  void BlockBackward(int unit, const float* xin, LayerActs& a) {
    const int C = this->C(), NH = m.cfg_.heads;
    const int n = static_cast<int>(N());
    nn::MatmulBackward(w.dres.data(), a.gelu.data(), W(unit, kFcProjW), w.dgelu.data(), G(unit, kFcProjW),
                       G(unit, kFcProjB), n, 4 * C, C);
    nn::GeluBackward(a.fc.data(), w.dgelu.data(), w.dfc.data(), N() * 4 * C);
    nn::MatmulBackward(w.dfc.data(), a.ln2.data(), W(unit, kFcW), w.dln.data(), G(unit, kFcW), G(unit, kFcB), n, C,
                       4 * C);
    nn::LayerNormBackward(w.dln.data(), a.xmid.data(), W(unit, kLn2W), a.mean2.data(), a.rstd2.data(), w.dres.data(),
                          G(unit, kLn2W), G(unit, kLn2B), n, C);
    nn::MatmulBackward(w.dres.data(), a.atty.data(), W(unit, kProjW), w.datty.data(), G(unit, kProjW),
                       G(unit, kProjB), n, C, C);
    nn::AttentionBackward(w.datty.data(), a.qkv.data(), a.att.data(), w.dqkv.data(), w.datt.data(), B, T, C, NH);
    nn::MatmulBackward(w.dqkv.data(), a.ln1.data(), W(unit, kAttnW), w.dln.data(), G(unit, kAttnW), G(unit, kAttnB),
                       n, C, 3 * C);
    nn::LayerNormBackward(w.dln.data(), xin, W(unit, kLn1W), a.mean1.data(), a.rstd1.data(), w.dres.data(),
                          G(unit, kLn1W), G(unit, kLn1B), n, C);
  }

  // Embedding lookup, the blocks, the final LayerNorm, and the tied head with the loss (when targets).
  absl::StatusOr<double> Forward(const int32_t* inputs, const int32_t* targets, std::vector<float>* logits,
                                 int position) {
    const int C = this->C(), V = m.cfg_.vocab;
    STRATA_RETURN_IF_ERROR(Begin(m.embed_, false));
    nn::EmbeddingForward(inputs, W(m.embed_, 0), W(m.embed_, 1), w.x[0].data(), B, T, C);
    STRATA_RETURN_IF_ERROR(e.EndForward(m.embed_));
    for (int l = 0; l < m.cfg_.layers; ++l) {
      STRATA_RETURN_IF_ERROR(Begin(m.blocks_[l], false));
      BlockForward(m.blocks_[l], w.x[l].data(), w.acts[w.recompute ? 0 : l], w.x[l + 1].data());
      STRATA_RETURN_IF_ERROR(e.EndForward(m.blocks_[l]));
    }
    STRATA_RETURN_IF_ERROR(Begin(m.ln_f_, false));
    nn::LayerNormForward(w.x[m.cfg_.layers].data(), W(m.ln_f_, 0), W(m.ln_f_, 1), w.lnf.data(), w.meanf.data(),
                         w.rstdf.data(), static_cast<int>(N()), C);
    STRATA_RETURN_IF_ERROR(e.EndForward(m.ln_f_));
    STRATA_RETURN_IF_ERROR(Begin(m.embed_, false));
    nn::MatmulTransBForward(w.lnf.data(), W(m.embed_, 0), w.dlogits.data(), static_cast<int>(N()), C, V);
    STRATA_RETURN_IF_ERROR(e.EndForward(m.embed_));
    if (logits != nullptr) {
      const float* row = w.dlogits.data() + size_t(position) * V;
      logits->assign(row, row + V);
    }
    if (targets == nullptr) return 0.0;
    const double loss = nn::CrossEntropyForward(w.dlogits.data(), targets, w.probs.data(), w.losses.data(),
                                                static_cast<int>(N()), V);
    if (std::isnan(loss)) {
      return absl::InvalidArgumentError(absl::StrCat("a target token is outside the vocabulary of ", V));
    }
    return loss;
  }

  absl::Status Backward(const int32_t* inputs, const int32_t* targets, float loss_scale) {
    const int C = this->C(), V = m.cfg_.vocab, L = m.cfg_.layers;
    const int n = static_cast<int>(N());
    nn::CrossEntropyBackward(w.probs.data(), targets, w.dlogits.data(), loss_scale / static_cast<float>(N()), n, V);
    STRATA_RETURN_IF_ERROR(Begin(m.embed_, true));
    nn::MatmulTransBBackward(w.dlogits.data(), w.lnf.data(), W(m.embed_, 0), w.dln.data(), G(m.embed_, 0), n, C, V);
    STRATA_RETURN_IF_ERROR(e.EndBackward(m.embed_));
    STRATA_RETURN_IF_ERROR(Begin(m.ln_f_, true));
    std::fill(w.dres.begin(), w.dres.end(), 0.0f);
    nn::LayerNormBackward(w.dln.data(), w.x[L].data(), W(m.ln_f_, 0), w.meanf.data(), w.rstdf.data(), w.dres.data(),
                          G(m.ln_f_, 0), G(m.ln_f_, 1), n, C);
    STRATA_RETURN_IF_ERROR(e.EndBackward(m.ln_f_));
    for (int l = L - 1; l >= 0; --l) {
      STRATA_RETURN_IF_ERROR(Begin(m.blocks_[l], true));
      LayerActs& a = w.acts[w.recompute ? 0 : l];
      if (w.recompute) {
        // Activation checkpointing: rebuild this block's activations from its saved input. The output it
        // rewrites into x[l+1] is bit-identical to the forward's (same operations, same order).
        BlockForward(m.blocks_[l], w.x[l].data(), a, w.x[l + 1].data());
      }
      BlockBackward(m.blocks_[l], w.x[l].data(), a);
      STRATA_RETURN_IF_ERROR(e.EndBackward(m.blocks_[l]));
    }
    STRATA_RETURN_IF_ERROR(Begin(m.embed_, true));
    nn::EmbeddingBackward(w.dres.data(), inputs, G(m.embed_, 0), G(m.embed_, 1), B, T, C);
    return e.EndBackward(m.embed_);
  }
};

absl::StatusOr<double> GptModel::TrainMicroBatch(Engine& e, const int32_t* inputs, const int32_t* targets, int B,
                                                 float loss_scale, bool checkpointing) {
  Prepare(*ws_, cfg_, B, cfg_.seq_len, checkpointing);
  Pass pass{*this, e, *ws_, B, cfg_.seq_len};
  STRATA_ASSIGN_OR_RETURN(double loss, pass.Forward(inputs, targets, nullptr, 0));
  STRATA_RETURN_IF_ERROR(pass.Backward(inputs, targets, loss_scale));
  return loss;
}

absl::StatusOr<double> GptModel::Forward(Engine& e, const int32_t* inputs, const int32_t* targets, int B, int T,
                                         std::vector<float>* logits, int position) {
  if (T < 1 || T > cfg_.seq_len) {
    return absl::InvalidArgumentError(absl::StrCat("sequence of ", T, " tokens; the model takes 1 to ", cfg_.seq_len));
  }
  if (position >= T) return absl::InvalidArgumentError(absl::StrCat("logits position ", position, " >= T=", T));
  Prepare(*ws_, cfg_, B, T, /*recompute=*/true);
  Pass pass{*this, e, *ws_, B, T};
  return pass.Forward(inputs, targets, logits, position < 0 ? T - 1 : position);
}

}  // namespace strata::gpt
