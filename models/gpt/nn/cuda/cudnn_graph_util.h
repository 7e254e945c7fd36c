// Checked plumbing over cuDNN's backend graph API (cudnn_graph.h, cuDNN 9): an owner for backend
// descriptors, a builder that records tensors and operations and turns them into a finalized execution
// plan (operation graph -> engine heuristics -> the first engine config whose plan finalizes), and the
// variant-pack / execute step. Written against the backend C API directly; no cudnn-frontend.
//
// Failure protocol: every cuDNN call is checked where it is made. The builder is sticky: the first failure
// is kept, later calls do nothing, and Build() returns it. Messages name the graph, the call, the
// descriptor and attribute involved, cudnnGetErrorString of the status and cudnnGetLastErrorString (the
// backend's own explanation, often the only useful one), so one GPU run can diagnose a rejected graph.
// A NOT_SUPPORTED-category status from finalizing the graph, from the heuristics or from every proposed
// plan becomes SdpaCode::kUnsupported (the caller falls back); anything else is kCudnnError.
// Internal to strata_gpt_cudnn: includes cudnn.h.
#pragma once

#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "models/gpt/nn/cuda/sdpa_layout.h"
#include "models/gpt/nn/cuda/sdpa_status.h"

namespace strata::kernels::cuda::cudnn_graph {

// "<where>: <call>: CUDNN_STATUS_... (code); cuDNN: <last error string>", as kUnsupported when the status
// is in the NOT_SUPPORTED category and `unsupported_ok`, kCudnnError otherwise.
SdpaStatus CudnnFailure(const std::string& where, const std::string& call, cudnnStatus_t st,
                        bool unsupported_ok = false);
// "<where>: <call>: <cudaGetErrorString> (<code>)" as kCudaError.
SdpaStatus CudaFailure(const std::string& where, const std::string& call, cudaError_t e);

// Owns one cudnnBackendDescriptor_t (destroyed on scope exit). Move-only.
class Desc {
 public:
  Desc() = default;
  Desc(Desc&& o) noexcept : d_(std::exchange(o.d_, nullptr)) {}
  Desc& operator=(Desc&& o) noexcept;
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  ~Desc();

  // Creates a descriptor of `type`; `what` names it in the error.
  static SdpaStatus Create(cudnnBackendDescriptorType_t type, const std::string& what, Desc* out);
  cudnnBackendDescriptor_t get() const { return d_; }
  // For attributes that take an array of descriptors of length 1.
  const cudnnBackendDescriptor_t* address() const { return &d_; }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

// An attribute with its name, for messages: STRATA_CUDNN_ATTR(CUDNN_ATTR_TENSOR_STRIDES).
struct Attr {
  cudnnBackendAttributeName_t name;
  const char* text;
};
#define STRATA_CUDNN_ATTR(a) \
  ::strata::kernels::cuda::cudnn_graph::Attr { a, #a }

// Sets one attribute; the error names `what` and the attribute.
SdpaStatus SetAttr(const Desc& d, const std::string& what, Attr a, cudnnBackendAttributeType_t type, int64_t count,
                   const void* values);

// A finalized execution plan and what executing it needs besides the caller's pointers.
struct Plan {
  std::string name;  // the graph's, for messages
  // The operation graph, its tensors and operations, the engine config: the plan may refer to them, so
  // they live as long as it does (declared first, destroyed after `plan`).
  std::vector<Desc> keep_alive;
  Desc plan;
  int64_t workspace_bytes = 0;  // cuDNN's own scratch (CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE)
  int64_t engine_index = -1;    // CUDNN_ATTR_ENGINE_GLOBAL_INDEX of the chosen engine, -1 if unknown
  // By-value scalars (attention scale, mask fill value, ...): their host values go into every variant
  // pack. A vector that never changes after Build, so the pointers stay valid.
  std::vector<int64_t> scalar_uids;
  std::vector<float> scalar_values;
};

// Records tensors and operations (in topological order) and builds a Plan from them.
class GraphBuilder {
 public:
  explicit GraphBuilder(std::string name) : name_(std::move(name)) {}

  // Tensors. Each returns the tensor's uid (meaningless after a failure; Build reports it).
  // A non-virtual tensor, bound at execution to the pointer given for `uid` (uids below kFirstVirtualUid).
  int64_t Tensor(int64_t uid, const char* what, cudnnDataType_t type, const SdpaView& view);
  // A virtual (never stored) intermediate, packed strides unless given.
  int64_t Virtual(const char* what, cudnnDataType_t type, const Dims4& dims);
  int64_t Virtual(const char* what, cudnnDataType_t type, const Dims4& dims, const Dims4& strides);
  // An fp32 scalar passed by value (dims and strides all 1).
  int64_t Scalar(const char* what, float value);

  // Operations, each writing its output tensor y (or c).
  // y = mode(x[, b[, t]]) elementwise with broadcasting; b, t = 0 when absent; math is the compute type.
  void Pointwise(const char* what, cudnnPointwiseMode_t mode, cudnnDataType_t math, int64_t y, int64_t x, int64_t b = 0,
                 int64_t t = 0);
  // y = the index of each element of x along `axis` (CUDNN_POINTWISE_GEN_INDEX).
  void GenIndex(const char* what, int64_t x, int64_t y, int64_t axis);
  // y = x reduced with `op` over the dims where y's extent is 1; fp32 accumulation.
  void Reduction(const char* what, cudnnReduceTensorOp_t op, int64_t x, int64_t y);
  // c = a @ b over the last two dims, batched over the first two; fp32 accumulation.
  void Matmul(const char* what, int64_t a, int64_t b, int64_t c);
  // y = x viewed with y's dims and strides (used for transposes).
  void Reshape(const char* what, int64_t x, int64_t y);

  // Finalizes the operation graph into `graph`. With a null handle no GPU is needed: cuDNN (9.19 at least)
  // still checks every descriptor and the graph's shape, though not whether an engine can run it.
  SdpaStatus FinalizeGraph(cudnnHandle_t handle, Desc* graph);
  // Finalizes the operation graph, asks the heuristics (mode A, then FALLBACK) for engine configs and
  // keeps the first whose execution plan finalizes, with its workspace size.
  SdpaStatus Build(cudnnHandle_t handle, Plan* plan);

  static constexpr int64_t kFirstVirtualUid = 1000;

  // An attribute value to set: `count` elements of `type` at `value`.
  struct AttrValue {
    Attr attr;
    cudnnBackendAttributeType_t type;
    const void* value;
    int64_t count = 1;
  };

 private:
  bool ok() const { return status_.ok(); }
  bool Check(SdpaStatus s);
  bool NewTensor(int64_t uid, const std::string& what, cudnnDataType_t type, const Dims4& dims, const Dims4& strides,
                 bool is_virtual, bool by_value);
  const Desc& TensorDesc(int64_t uid);
  void PointwiseOp(const char* what, cudnnPointwiseMode_t mode, cudnnDataType_t math, int64_t y, int64_t x, int64_t b,
                   int64_t t, int64_t axis);
  // Creates a descriptor of `type` with `attrs` set and finalizes it; false (status kept) on a failure.
  bool NewDesc(cudnnBackendDescriptorType_t type, const std::string& what, const std::vector<AttrValue>& attrs,
               Desc* out);
  // Adds an operation built from `attrs`, keeping its `config` descriptor (pointwise, reduction, matmul;
  // moved from) alive with the graph.
  void AddOperation(cudnnBackendDescriptorType_t type, const std::string& what, const std::vector<AttrValue>& attrs,
                    Desc* config);
  SdpaStatus PlanFromHeuristics(cudnnHandle_t handle, const Desc& graph, Plan* plan);

  std::string name_;
  SdpaStatus status_;
  std::unordered_map<int64_t, Desc> tensors_;
  std::vector<Desc> ops_;
  std::vector<Desc> keep_alive_;  // operation sub-descriptors (pointwise, reduction, matmul)
  std::vector<int64_t> scalar_uids_;
  std::vector<float> scalar_values_;
  int64_t next_virtual_uid_ = kFirstVirtualUid;
};

// Runs `plan` on the stream set on `handle`. `bindings` maps each non-virtual uid to its device pointer;
// the plan's by-value scalars are added here. `workspace` must hold plan.workspace_bytes.
SdpaStatus Execute(cudnnHandle_t handle, const Plan& plan, const std::vector<std::pair<int64_t, void*>>& bindings,
                   void* workspace);

}  // namespace strata::kernels::cuda::cudnn_graph
