#include "runtime/comm/host_communicator.h"

#include <cstring>

#include "kernels/cpu/tensor_ops.h"
#include "runtime/device/host_device.h"

namespace strata::comm {

namespace kc = kernels::cpu;

// The host element math of the collectives is the kernels' (kernels/cpu/tensor_ops.h): the vector table
// of this CPU for fp32, on the calling thread (a collective's reduction runs on its stream's thread).
void AccumulateInto(void* dst, const void* src, size_t count, DType dtype) {
  switch (dtype) {
    case DType::kF32:
      kc::Accumulate(kc::BestCpuKernels(), nullptr, static_cast<const float*>(src), static_cast<float*>(dst), count);
      return;
    case DType::kBF16:
      kc::AccumulateBf16(static_cast<const uint16_t*>(src), static_cast<uint16_t*>(dst), count);
      return;
    case DType::kF16:
      kc::AccumulateHalf(static_cast<const uint16_t*>(src), static_cast<uint16_t*>(dst), count);
      return;
  }
}

void ScaleInPlace(void* dst, size_t count, DType dtype, float factor) {
  switch (dtype) {
    case DType::kF32:
      kc::Scale(kc::BestCpuKernels(), nullptr, static_cast<float*>(dst), static_cast<float*>(dst), count, factor);
      return;
    case DType::kBF16:
      kc::ScaleBf16(static_cast<uint16_t*>(dst), count, factor);
      return;
    case DType::kF16:
      kc::ScaleHalf(static_cast<uint16_t*>(dst), count, factor);
      return;
  }
}

Work HostCommunicator::Submit(device::Stream& stream, std::function<absl::Status(uint64_t)> run) {
  const uint64_t seq = next_seq_.fetch_add(1);
  stream.Enqueue([run = std::move(run), seq]() { return run(seq); });
  auto done = std::make_shared<device::HostEvent>();
  stream.Record(*done);
  return Work(std::move(done));
}

Work HostCommunicator::AllGather(const void* send, void* recv, size_t count, DType dtype, device::Stream& stream) {
  traffic_.Add(Collective::kAllGather, PayloadBytes(Collective::kAllGather, count, dtype, size()));
  return Submit(stream, [=, this](uint64_t seq) { return RunAllGather(send, recv, count, dtype, seq); });
}

Work HostCommunicator::ReduceScatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                                     device::Stream& stream) {
  traffic_.Add(Collective::kReduceScatter, PayloadBytes(Collective::kReduceScatter, count, dtype, size()));
  return Submit(stream, [=, this](uint64_t seq) { return RunReduceScatter(send, recv, count, dtype, op, seq); });
}

Work HostCommunicator::AllReduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                                 device::Stream& stream) {
  traffic_.Add(Collective::kAllReduce, PayloadBytes(Collective::kAllReduce, count, dtype, size()));
  return Submit(stream, [=, this](uint64_t seq) { return RunAllReduce(send, recv, count, dtype, op, seq); });
}

Work HostCommunicator::Broadcast(void* buf, size_t count, DType dtype, int root, device::Stream& stream) {
  traffic_.Add(Collective::kBroadcast, PayloadBytes(Collective::kBroadcast, count, dtype, size()));
  return Submit(stream, [=, this](uint64_t seq) { return RunBroadcast(buf, count, dtype, root, seq); });
}

Work HostCommunicator::Barrier(device::Stream& stream) {
  traffic_.Add(Collective::kBarrier, 0);
  return Submit(stream, [this](uint64_t seq) { return RunBarrier(seq); });
}

}  // namespace strata::comm
