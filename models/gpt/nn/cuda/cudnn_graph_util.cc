// Backend graph plumbing (cudnn_graph_util.h).
#include "models/gpt/nn/cuda/cudnn_graph_util.h"

#include <array>

namespace strata::kernels::cuda::cudnn_graph {
namespace {

// cuDNN 9 marks CUDNN_ATTR_OPERATIONGRAPH_HANDLE and CUDNN_ATTR_EXECUTION_PLAN_HANDLE deprecated, yet the
// backend samples and the cudnn-frontend graph builder still set both, and cuDNN 8 required them. 9.19
// finalizes an operation graph without a handle (CheckSdpaGraph relies on that); whether every earlier
// 9.x release does is not established, so with a handle at hand we set them, the warning silenced here
// only (the release build is -Werror).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
constexpr Attr kGraphHandle{CUDNN_ATTR_OPERATIONGRAPH_HANDLE, "CUDNN_ATTR_OPERATIONGRAPH_HANDLE"};
constexpr Attr kPlanHandle{CUDNN_ATTR_EXECUTION_PLAN_HANDLE, "CUDNN_ATTR_EXECUTION_PLAN_HANDLE"};
#pragma GCC diagnostic pop

constexpr int64_t kTensorAlignmentBytes = 16;  // every bound pointer is 16-byte aligned (sdpa_cudnn.h)
constexpr cudnnDataType_t kF32 = CUDNN_DATA_FLOAT;

// One backend-descriptor attribute (CUDNN_TYPE_BACKEND_DESCRIPTOR, one element) pointing at `d`.
GraphBuilder::AttrValue DescAttr(Attr a, const Desc& d) { return {a, CUDNN_TYPE_BACKEND_DESCRIPTOR, d.address()}; }

std::string LastCudnnError() {
  std::array<char, 4096> buf{};
  cudnnGetLastErrorString(buf.data(), buf.size());
  buf.back() = '\0';
  return buf.data();
}

SdpaStatus Finalize(const Desc& d, const std::string& what, bool unsupported_ok = false) {
  const cudnnStatus_t st = cudnnBackendFinalize(d.get());
  return st == CUDNN_STATUS_SUCCESS ? SdpaStatus::Ok() : CudnnFailure(what, "cudnnBackendFinalize", st, unsupported_ok);
}

// CUDNN_ATTR_ENGINE_GLOBAL_INDEX of the engine behind `cfg`, -1 when it cannot be read (diagnostics only).
int64_t EngineIndex(const Desc& cfg) {
  Desc engine;
  if (!Desc::Create(CUDNN_BACKEND_ENGINE_DESCRIPTOR, "engine", &engine).ok()) return -1;
  cudnnBackendDescriptor_t raw = engine.get();
  int64_t n = 0, index = -1;
  if (cudnnBackendGetAttribute(cfg.get(), CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &raw) !=
          CUDNN_STATUS_SUCCESS ||
      cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &index) !=
          CUDNN_STATUS_SUCCESS) {
    return -1;
  }
  return index;
}

// The engine configs the heuristics propose for `graph` in `mode`, best first, in *configs (with the
// heuristics descriptor they came from). When there are none, why is appended to *failures and the
// result is still Ok; only a failing call is an error.
SdpaStatus ProposedConfigs(const Desc& graph, cudnnBackendHeurMode_t mode, const std::string& w, Desc* heur,
                           std::vector<Desc>* configs, std::string* failures) {
  SdpaStatus s = Desc::Create(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, w, heur);
  if (s.ok()) {
    s = SetAttr(*heur, w, STRATA_CUDNN_ATTR(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH), CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                graph.address());
  }
  if (s.ok()) s = SetAttr(*heur, w, STRATA_CUDNN_ATTR(CUDNN_ATTR_ENGINEHEUR_MODE), CUDNN_TYPE_HEUR_MODE, 1, &mode);
  if (s.ok()) s = Finalize(*heur, w, /*unsupported_ok=*/true);
  if (s.code == SdpaCode::kUnsupported) {
    *failures += "\n  " + s.message;
    return SdpaStatus::Ok();
  }
  if (!s.ok()) return s;
  int64_t count = 0;
  cudnnStatus_t st = cudnnBackendGetAttribute(heur->get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                              0, &count, nullptr);
  if (st != CUDNN_STATUS_SUCCESS) return CudnnFailure(w, "cudnnBackendGetAttribute(RESULTS count)", st);
  configs->resize(static_cast<size_t>(count));
  std::vector<cudnnBackendDescriptor_t> raw(static_cast<size_t>(count));
  for (size_t i = 0; i < raw.size(); ++i) {
    if (s = Desc::Create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, w, &(*configs)[i]); !s.ok()) return s;
    raw[i] = (*configs)[i].get();
  }
  int64_t got = 0;
  st = cudnnBackendGetAttribute(heur->get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got,
                                raw.data());
  if (st != CUDNN_STATUS_SUCCESS) return CudnnFailure(w, "cudnnBackendGetAttribute(RESULTS)", st);
  configs->resize(static_cast<size_t>(got));
  if (got == 0) {
    // cuDNN drops the candidates its own support checks reject before returning any; the last-error
    // string then holds its per-engine reasons (all of them with CUDNN_LOGLEVEL_DBG=2).
    *failures += "\n  " + w + ": no engine config; cuDNN: " + LastCudnnError();
  }
  return SdpaStatus::Ok();
}

// Finalizes the execution plan of `config` into *plan (plan and workspace size).
SdpaStatus PlanOf(cudnnHandle_t handle, const Desc& config, const std::string& w, Plan* plan) {
  Desc p;
  SdpaStatus s = Desc::Create(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, w, &p);
  if (s.ok()) s = SetAttr(p, w, kPlanHandle, CUDNN_TYPE_HANDLE, 1, &handle);
  if (s.ok()) {
    s = SetAttr(p, w, STRATA_CUDNN_ATTR(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG), CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                config.address());
  }
  if (s.ok()) s = Finalize(p, w, /*unsupported_ok=*/true);
  if (!s.ok()) return s;
  int64_t n = 0;
  const cudnnStatus_t st = cudnnBackendGetAttribute(p.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64,
                                                    1, &n, &plan->workspace_bytes);
  if (st != CUDNN_STATUS_SUCCESS) return CudnnFailure(w, "cudnnBackendGetAttribute(WORKSPACE_SIZE)", st);
  plan->engine_index = EngineIndex(config);
  plan->plan = std::move(p);
  return SdpaStatus::Ok();
}

}  // namespace

SdpaStatus CudnnFailure(const std::string& where, const std::string& call, cudnnStatus_t st, bool unsupported_ok) {
  std::string msg =
      where + ": " + call + ": " + cudnnGetErrorString(st) + " (" + std::to_string(static_cast<int>(st)) + ")";
  const std::string last = LastCudnnError();
  if (!last.empty()) msg += "; cuDNN: " + last;
  const bool unsupported = unsupported_ok && CUDNN_STATUS_CATEGORY(st) == CUDNN_STATUS_NOT_SUPPORTED;
  return SdpaStatus::Error(unsupported ? SdpaCode::kUnsupported : SdpaCode::kCudnnError, std::move(msg));
}

SdpaStatus CudaFailure(const std::string& where, const std::string& call, cudaError_t e) {
  return SdpaStatus::Error(SdpaCode::kCudaError, where + ": " + call + ": " + cudaGetErrorString(e) + " (" +
                                                     std::to_string(static_cast<int>(e)) + ")");
}

Desc& Desc::operator=(Desc&& o) noexcept {
  if (this != &o) {
    if (d_ != nullptr) cudnnBackendDestroyDescriptor(d_);
    d_ = std::exchange(o.d_, nullptr);
  }
  return *this;
}

Desc::~Desc() {
  if (d_ != nullptr) cudnnBackendDestroyDescriptor(d_);
}

SdpaStatus Desc::Create(cudnnBackendDescriptorType_t type, const std::string& what, Desc* out) {
  cudnnBackendDescriptor_t d = nullptr;
  const cudnnStatus_t st = cudnnBackendCreateDescriptor(type, &d);
  if (st != CUDNN_STATUS_SUCCESS) return CudnnFailure(what, "cudnnBackendCreateDescriptor", st);
  *out = Desc();
  out->d_ = d;
  return SdpaStatus::Ok();
}

SdpaStatus SetAttr(const Desc& d, const std::string& what, Attr a, cudnnBackendAttributeType_t type, int64_t count,
                   const void* values) {
  const cudnnStatus_t st = cudnnBackendSetAttribute(d.get(), a.name, type, count, values);
  return st == CUDNN_STATUS_SUCCESS ? SdpaStatus::Ok()
                                    : CudnnFailure(what, std::string("cudnnBackendSetAttribute(") + a.text + ")", st);
}

bool GraphBuilder::Check(SdpaStatus s) {
  if (!s.ok() && status_.ok()) status_ = std::move(s);
  return status_.ok();
}

bool GraphBuilder::NewDesc(cudnnBackendDescriptorType_t type, const std::string& what,
                           const std::vector<AttrValue>& attrs, Desc* out) {
  if (!ok() || !Check(Desc::Create(type, what, out))) return false;
  for (const AttrValue& a : attrs) {
    if (!Check(SetAttr(*out, what, a.attr, a.type, a.count, a.value))) return false;
  }
  return Check(Finalize(*out, what));
}

bool GraphBuilder::NewTensor(int64_t uid, const std::string& what, cudnnDataType_t type, const Dims4& dims,
                             const Dims4& strides, bool is_virtual, bool by_value) {
  const std::string w = name_ + ": tensor '" + what + "' (uid " + std::to_string(uid) + ")";
  Desc d;
  if (!NewDesc(CUDNN_BACKEND_TENSOR_DESCRIPTOR, w,
               {{STRATA_CUDNN_ATTR(CUDNN_ATTR_TENSOR_DATA_TYPE), CUDNN_TYPE_DATA_TYPE, &type},
                {STRATA_CUDNN_ATTR(CUDNN_ATTR_TENSOR_DIMENSIONS), CUDNN_TYPE_INT64, dims.data(), 4},
                {STRATA_CUDNN_ATTR(CUDNN_ATTR_TENSOR_STRIDES), CUDNN_TYPE_INT64, strides.data(), 4},
                {STRATA_CUDNN_ATTR(CUDNN_ATTR_TENSOR_UNIQUE_ID), CUDNN_TYPE_INT64, &uid},
                {STRATA_CUDNN_ATTR(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT), CUDNN_TYPE_INT64, &kTensorAlignmentBytes},
                {STRATA_CUDNN_ATTR(CUDNN_ATTR_TENSOR_IS_VIRTUAL), CUDNN_TYPE_BOOLEAN, &is_virtual},
                {STRATA_CUDNN_ATTR(CUDNN_ATTR_TENSOR_IS_BY_VALUE), CUDNN_TYPE_BOOLEAN, &by_value}},
               &d)) {
    return false;
  }
  tensors_.emplace(uid, std::move(d));
  return true;
}

const Desc& GraphBuilder::TensorDesc(int64_t uid) {
  static const Desc kNone;
  const auto it = tensors_.find(uid);
  if (it != tensors_.end()) return it->second;
  Check(SdpaStatus::Error(SdpaCode::kInvalidArgument,
                          name_ + ": an operation uses tensor uid " + std::to_string(uid) + ", never created"));
  return kNone;
}

int64_t GraphBuilder::Tensor(int64_t uid, const char* what, cudnnDataType_t type, const SdpaView& view) {
  if (uid >= kFirstVirtualUid) {
    Check(SdpaStatus::Error(SdpaCode::kInvalidArgument, name_ + ": bound tensor '" + what + "' uses uid " +
                                                            std::to_string(uid) + " from the virtual range"));
  }
  NewTensor(uid, what, type, view.dims, view.strides, /*is_virtual=*/false, /*by_value=*/false);
  return uid;
}

int64_t GraphBuilder::Virtual(const char* what, cudnnDataType_t type, const Dims4& dims) {
  return Virtual(what, type, dims, PackedStrides(dims));
}

int64_t GraphBuilder::Virtual(const char* what, cudnnDataType_t type, const Dims4& dims, const Dims4& strides) {
  const int64_t uid = next_virtual_uid_++;
  NewTensor(uid, what, type, dims, strides, /*is_virtual=*/true, /*by_value=*/false);
  return uid;
}

int64_t GraphBuilder::Scalar(const char* what, float value) {
  const int64_t uid = next_virtual_uid_++;
  if (NewTensor(uid, what, kF32, {1, 1, 1, 1}, {1, 1, 1, 1}, /*is_virtual=*/false, /*by_value=*/true)) {
    scalar_uids_.push_back(uid);
    scalar_values_.push_back(value);
  }
  return uid;
}

void GraphBuilder::AddOperation(cudnnBackendDescriptorType_t type, const std::string& what,
                                const std::vector<AttrValue>& attrs, Desc* config) {
  Desc op;
  if (!NewDesc(type, what, attrs, &op)) return;
  ops_.push_back(std::move(op));
  if (config != nullptr) keep_alive_.push_back(std::move(*config));
}

void GraphBuilder::Pointwise(const char* what, cudnnPointwiseMode_t mode, cudnnDataType_t math, int64_t y, int64_t x,
                             int64_t b, int64_t t) {
  PointwiseOp(what, mode, math, y, x, b, t, /*axis=*/-1);
}

void GraphBuilder::GenIndex(const char* what, int64_t x, int64_t y, int64_t axis) {
  PointwiseOp(what, CUDNN_POINTWISE_GEN_INDEX, kF32, y, x, 0, 0, axis);
}

void GraphBuilder::PointwiseOp(const char* what, cudnnPointwiseMode_t mode, cudnnDataType_t math, int64_t y, int64_t x,
                               int64_t b, int64_t t, int64_t axis) {
  const std::string w = name_ + ": pointwise '" + what + "'";
  std::vector<AttrValue> pw_attrs = {{STRATA_CUDNN_ATTR(CUDNN_ATTR_POINTWISE_MODE), CUDNN_TYPE_POINTWISE_MODE, &mode},
                                     {STRATA_CUDNN_ATTR(CUDNN_ATTR_POINTWISE_MATH_PREC), CUDNN_TYPE_DATA_TYPE, &math}};
  if (axis >= 0) pw_attrs.push_back({STRATA_CUDNN_ATTR(CUDNN_ATTR_POINTWISE_AXIS), CUDNN_TYPE_INT64, &axis});
  Desc pw;
  if (!NewDesc(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, w, pw_attrs, &pw)) return;
  std::vector<AttrValue> op_attrs = {DescAttr(STRATA_CUDNN_ATTR(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR), pw),
                                     DescAttr(STRATA_CUDNN_ATTR(CUDNN_ATTR_OPERATION_POINTWISE_XDESC), TensorDesc(x))};
  if (b != 0) op_attrs.push_back(DescAttr(STRATA_CUDNN_ATTR(CUDNN_ATTR_OPERATION_POINTWISE_BDESC), TensorDesc(b)));
  if (t != 0) op_attrs.push_back(DescAttr(STRATA_CUDNN_ATTR(CUDNN_ATTR_OPERATION_POINTWISE_TDESC), TensorDesc(t)));
  op_attrs.push_back(DescAttr(STRATA_CUDNN_ATTR(CUDNN_ATTR_OPERATION_POINTWISE_YDESC), TensorDesc(y)));
  AddOperation(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, w, op_attrs, &pw);
}

void GraphBuilder::Reduction(const char* what, cudnnReduceTensorOp_t reduce, int64_t x, int64_t y) {
  const std::string w = name_ + ": reduction '" + what + "'";
  Desc red;
  if (!NewDesc(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, w,
               {{STRATA_CUDNN_ATTR(CUDNN_ATTR_REDUCTION_OPERATOR), CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, &reduce},
                {STRATA_CUDNN_ATTR(CUDNN_ATTR_REDUCTION_COMP_TYPE), CUDNN_TYPE_DATA_TYPE, &kF32}},
               &red)) {
    return;
  }
  AddOperation(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, w,
               {DescAttr(STRATA_CUDNN_ATTR(CUDNN_ATTR_OPERATION_REDUCTION_XDESC), TensorDesc(x)),
                DescAttr(STRATA_CUDNN_ATTR(CUDNN_ATTR_OPERATION_REDUCTION_YDESC), TensorDesc(y)),
                DescAttr(STRATA_CUDNN_ATTR(CUDNN_ATTR_OPERATION_REDUCTION_DESC), red)},
               &red);
}

void GraphBuilder::Matmul(const char* what, int64_t a, int64_t b, int64_t c) {
  const std::string w = name_ + ": matmul '" + what + "'";
  Desc mm;
  if (!NewDesc(CUDNN_BACKEND_MATMUL_DESCRIPTOR, w,
               {{STRATA_CUDNN_ATTR(CUDNN_ATTR_MATMUL_COMP_TYPE), CUDNN_TYPE_DATA_TYPE, &kF32}}, &mm)) {
    return;
  }
  AddOperation(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, w,
               {DescAttr(STRATA_CUDNN_ATTR(CUDNN_ATTR_OPERATION_MATMUL_ADESC), TensorDesc(a)),
                DescAttr(STRATA_CUDNN_ATTR(CUDNN_ATTR_OPERATION_MATMUL_BDESC), TensorDesc(b)),
                DescAttr(STRATA_CUDNN_ATTR(CUDNN_ATTR_OPERATION_MATMUL_CDESC), TensorDesc(c)),
                DescAttr(STRATA_CUDNN_ATTR(CUDNN_ATTR_OPERATION_MATMUL_DESC), mm)},
               &mm);
}

void GraphBuilder::Reshape(const char* what, int64_t x, int64_t y) {
  AddOperation(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, name_ + ": reshape '" + what + "'",
               {DescAttr(STRATA_CUDNN_ATTR(CUDNN_ATTR_OPERATION_RESHAPE_XDESC), TensorDesc(x)),
                DescAttr(STRATA_CUDNN_ATTR(CUDNN_ATTR_OPERATION_RESHAPE_YDESC), TensorDesc(y))},
               nullptr);
}

SdpaStatus GraphBuilder::FinalizeGraph(cudnnHandle_t handle, Desc* graph) {
  if (!ok()) return status_;
  const std::string w = name_ + ": operation graph (" + std::to_string(ops_.size()) + " operations)";
  std::vector<cudnnBackendDescriptor_t> raw_ops;
  for (const Desc& op : ops_) raw_ops.push_back(op.get());
  std::vector<AttrValue> attrs = {{STRATA_CUDNN_ATTR(CUDNN_ATTR_OPERATIONGRAPH_OPS), CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                   raw_ops.data(), static_cast<int64_t>(raw_ops.size())}};
  if (handle != nullptr) attrs.push_back({kGraphHandle, CUDNN_TYPE_HANDLE, &handle});
  if (!Check(Desc::Create(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, w, graph))) return status_;
  for (const AttrValue& a : attrs) {
    if (!Check(SetAttr(*graph, w, a.attr, a.type, a.count, a.value))) return status_;
  }
  Check(Finalize(*graph, w, /*unsupported_ok=*/true));
  return status_;
}

SdpaStatus GraphBuilder::Build(cudnnHandle_t handle, Plan* plan) {
  Desc graph;
  if (!Check(FinalizeGraph(handle, &graph)) || !Check(PlanFromHeuristics(handle, graph, plan))) return status_;
  // The plan may refer to the graph and its descriptors; they live as long as it does.
  plan->name = name_;
  plan->scalar_uids = scalar_uids_;
  plan->scalar_values = scalar_values_;
  plan->keep_alive.push_back(std::move(graph));
  for (auto& [uid, d] : tensors_) plan->keep_alive.push_back(std::move(d));
  for (Desc& d : ops_) plan->keep_alive.push_back(std::move(d));
  for (Desc& d : keep_alive_) plan->keep_alive.push_back(std::move(d));
  tensors_.clear();
  ops_.clear();
  keep_alive_.clear();
  return SdpaStatus::Ok();
}

SdpaStatus GraphBuilder::PlanFromHeuristics(cudnnHandle_t handle, const Desc& graph, Plan* plan) {
  std::string failures;
  int64_t proposed = 0;
  for (const cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    const std::string w = name_ + ": engine heuristics (mode " + (mode == CUDNN_HEUR_MODE_A ? "A" : "FALLBACK") + ")";
    Desc heur;
    std::vector<Desc> configs;
    if (SdpaStatus s = ProposedConfigs(graph, mode, w, &heur, &configs, &failures); !s.ok()) return s;
    for (size_t i = 0; i < configs.size(); ++i, ++proposed) {
      const std::string pw =
          w + ", engine config " + std::to_string(i) + " (engine " + std::to_string(EngineIndex(configs[i])) + ")";
      const SdpaStatus s = PlanOf(handle, configs[i], pw, plan);
      if (!s.ok()) {  // this engine cannot run the graph here: try the next one
        failures += "\n  " + s.message;
        continue;
      }
      plan->keep_alive.push_back(std::move(configs[i]));
      plan->keep_alive.push_back(std::move(heur));
      return SdpaStatus::Ok();
    }
  }
  return SdpaStatus::Error(SdpaCode::kUnsupported, name_ + ": none of the " + std::to_string(proposed) +
                                                       " engine configs the heuristics proposed finalized:" + failures);
}

SdpaStatus Execute(cudnnHandle_t handle, const Plan& plan, const std::vector<std::pair<int64_t, void*>>& bindings,
                   void* workspace) {
  std::vector<int64_t> uids;
  std::vector<void*> ptrs;
  for (const auto& [uid, ptr] : bindings) {
    uids.push_back(uid);
    ptrs.push_back(ptr);
  }
  for (size_t i = 0; i < plan.scalar_uids.size(); ++i) {
    uids.push_back(plan.scalar_uids[i]);
    // cuDNN reads by-value scalars through a void*; it does not write them.
    ptrs.push_back(const_cast<float*>(&plan.scalar_values[i]));
  }
  const std::string w = plan.name + ": variant pack";
  Desc pack;
  SdpaStatus s = Desc::Create(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, w, &pack);
  if (s.ok()) {
    s = SetAttr(pack, w, STRATA_CUDNN_ATTR(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS), CUDNN_TYPE_INT64,
                static_cast<int64_t>(uids.size()), uids.data());
  }
  if (s.ok()) {
    s = SetAttr(pack, w, STRATA_CUDNN_ATTR(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS), CUDNN_TYPE_VOID_PTR,
                static_cast<int64_t>(ptrs.size()), ptrs.data());
  }
  if (s.ok()) {
    s = SetAttr(pack, w, STRATA_CUDNN_ATTR(CUDNN_ATTR_VARIANT_PACK_WORKSPACE), CUDNN_TYPE_VOID_PTR, 1, &workspace);
  }
  if (s.ok()) s = Finalize(pack, w);
  if (!s.ok()) return s;
  const cudnnStatus_t st = cudnnBackendExecute(handle, plan.plan.get(), pack.get());
  if (st != CUDNN_STATUS_SUCCESS) {
    return CudnnFailure(plan.name + " (engine " + std::to_string(plan.engine_index) + ")", "cudnnBackendExecute", st);
  }
  return SdpaStatus::Ok();
}

}  // namespace strata::kernels::cuda::cudnn_graph
