// Shared machinery of the host back-ends (in-process and MPI): each collective becomes a task on the
// issuing stream's worker, which runs a blocking, deadline-bounded implementation, then records the
// Work's event. Back-ends implement the Run* methods; they are called on the stream worker.
#pragma once

#include <atomic>
#include <memory>

#include "runtime/comm/communicator.h"

namespace strata::comm {

// The element reduction used by host back-ends: dst[i] += src[i] in dtype (bf16/fp16 via fp32).
void AccumulateInto(void* dst, const void* src, size_t count, DType dtype);
// dst[i] *= factor in dtype.
void ScaleInPlace(void* dst, size_t count, DType dtype, float factor);

class HostCommunicator : public Communicator {
 public:
  Work AllGather(const void* send, void* recv, size_t count, DType dtype, device::Stream& stream) override;
  Work ReduceScatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                     device::Stream& stream) override;
  Work AllReduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                 device::Stream& stream) override;
  Work Broadcast(void* buf, size_t count, DType dtype, int root, device::Stream& stream) override;
  Work Barrier(device::Stream& stream) override;
  Traffic traffic() const override { return traffic_.Read(); }

 protected:
  // `seq` numbers this communicator's collectives from 0, for error messages.
  virtual absl::Status RunAllGather(const void* send, void* recv, size_t count, DType dtype, uint64_t seq) = 0;
  virtual absl::Status RunReduceScatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                                        uint64_t seq) = 0;
  virtual absl::Status RunAllReduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                                    uint64_t seq) = 0;
  virtual absl::Status RunBroadcast(void* buf, size_t count, DType dtype, int root, uint64_t seq) = 0;
  virtual absl::Status RunBarrier(uint64_t seq) = 0;

 private:
  Work Submit(device::Stream& stream, std::function<absl::Status(uint64_t)> run);
  std::atomic<uint64_t> next_seq_{0};
  TrafficCounter traffic_;  // Note [Traffic], counted as each collective is submitted
};

}  // namespace strata::comm
