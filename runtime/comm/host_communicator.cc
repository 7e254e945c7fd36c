#include "runtime/comm/host_communicator.h"

#include <cstring>

#include "kernels/common/element_math.h"
#include "runtime/device/host_device.h"

namespace strata::comm {

void AccumulateInto(void* dst, const void* src, size_t count, DType dtype) {
  switch (dtype) {
    case DType::kF32: {
      float* d = static_cast<float*>(dst);
      const float* s = static_cast<const float*>(src);
      for (size_t i = 0; i < count; ++i) d[i] += s[i];
      return;
    }
    case DType::kBF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < count; ++i) {
        d[i] = kernels::FloatToBf16(kernels::Bf16ToFloat(d[i]) + kernels::Bf16ToFloat(s[i]));
      }
      return;
    }
    case DType::kF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < count; ++i) {
        d[i] = kernels::FloatToHalf(kernels::HalfToFloat(d[i]) + kernels::HalfToFloat(s[i]));
      }
      return;
    }
  }
}

void ScaleInPlace(void* dst, size_t count, DType dtype, float factor) {
  switch (dtype) {
    case DType::kF32: {
      float* d = static_cast<float*>(dst);
      for (size_t i = 0; i < count; ++i) d[i] *= factor;
      return;
    }
    case DType::kBF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < count; ++i) d[i] = kernels::FloatToBf16(kernels::Bf16ToFloat(d[i]) * factor);
      return;
    }
    case DType::kF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < count; ++i) d[i] = kernels::FloatToHalf(kernels::HalfToFloat(d[i]) * factor);
      return;
    }
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
  return Submit(stream, [=, this](uint64_t seq) { return RunAllGather(send, recv, count, dtype, seq); });
}

Work HostCommunicator::ReduceScatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                                     device::Stream& stream) {
  return Submit(stream, [=, this](uint64_t seq) { return RunReduceScatter(send, recv, count, dtype, op, seq); });
}

Work HostCommunicator::AllReduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                                 device::Stream& stream) {
  return Submit(stream, [=, this](uint64_t seq) { return RunAllReduce(send, recv, count, dtype, op, seq); });
}

Work HostCommunicator::Broadcast(void* buf, size_t count, DType dtype, int root, device::Stream& stream) {
  return Submit(stream, [=, this](uint64_t seq) { return RunBroadcast(buf, count, dtype, root, seq); });
}

Work HostCommunicator::Barrier(device::Stream& stream) {
  return Submit(stream, [this](uint64_t seq) { return RunBarrier(seq); });
}

}  // namespace strata::comm
