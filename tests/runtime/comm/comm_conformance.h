// The Communicator conformance suite (CONVENTIONS 9): one set of per-rank test bodies, run against
// every back-end. A back-end's test binary builds a RankHarness for each rank (a communicator, a
// device and a stream to issue on) and calls every Case's body on it: the in-process back-end runs the
// ranks as threads of one process (in_process_test.cc), MPI as the processes of an mpirun job
// (mpi_test.cc).
//
// Rules every body follows, so that one misbehaving rank fails the test instead of hanging the job:
//  - every rank issues the same collectives in the same order whatever the data looks like (data is
//    checked with EXPECT_*, never ASSERT_*, once collectives have started);
//  - failures print the rank, the collective, dtype, op and count, the index, expected and actual.
//
// Data. fp32 inputs are small integers, so fp32 sums are exact and compared with zero tolerance.
// bf16 inputs are multiples of 1/7 rounded to bf16, so sums round; they are compared with a
// double-precision oracle under the bound described at BF16Tolerance in comm_conformance.cc.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/common/element_math.h"
#include "runtime/base/dtype.h"
#include "runtime/comm/communicator.h"
#include "runtime/device/device.h"

namespace strata::comm::conformance {

// What one rank's body works with. `stream` is fresh for each case; more streams and events come
// from `device`.
struct RankHarness {
  Communicator& comm;
  device::Device& device;
  device::Stream& stream;
};

struct Case {
  std::string name;  // a GoogleTest-safe identifier: "AllReduceInPlace"
  std::function<void(RankHarness&)> body;
};

// Every case, in a fixed order (all ranks of an MPI job run the same sequence).
const std::vector<Case>& Cases();

// Element counts of the data cases: empty, one, odd, large, and 1001 (not a multiple of 2, 3 or 4).
inline constexpr size_t kCounts[] = {0, 1, 7, 1000, 1001};

// Where HostArray keeps its bytes: the heap, unless a back-end's test binary installs other functions
// before any case runs. The NCCL test installs CUDA managed memory, which both the host and NCCL's
// kernels address, so that the cases run unchanged on a device-buffer back-end.
struct ArrayMemory {
  void* (*allocate)(size_t bytes);  // nullptr when it cannot
  void (*release)(void* p);
};
void SetArrayMemory(ArrayMemory memory);
const ArrayMemory& GetArrayMemory();

// A flat host buffer of `count` elements of `dtype`, followed by guard elements; every byte starts as
// a sentinel so that elements a collective failed to write, or wrote past the end, are visible.
class HostArray {
 public:
  static constexpr unsigned char kSentinelByte = 0xA5;  // 0xA5A5A5A5 as fp32, 0xA5A5 as bf16: about -2.9e-16
  static constexpr size_t kGuardElems = 4;

  HostArray(DType dtype, size_t count)
      : dtype_(dtype), count_(count), size_((count + kGuardElems) * DTypeBytes(dtype)),
        bytes_(static_cast<unsigned char*>(GetArrayMemory().allocate(size_)), GetArrayMemory().release) {
    if (bytes_ == nullptr) std::abort();  // a test harness out of memory
    std::memset(bytes_.get(), kSentinelByte, size_);
  }
  DType dtype() const { return dtype_; }
  size_t count() const { return count_; }
  void* data() { return bytes_.get(); }
  const void* data() const { return bytes_.get(); }
  void* at(size_t i) { return bytes_.get() + i * DTypeBytes(dtype_); }
  // Rounds to dtype.
  void Set(size_t i, float v) {
    if (dtype_ == DType::kF32) {
      std::memcpy(at(i), &v, sizeof(v));
      return;
    }
    const uint16_t h = dtype_ == DType::kBF16 ? kernels::FloatToBf16(v) : kernels::FloatToHalf(v);
    std::memcpy(at(i), &h, sizeof(h));
  }
  double Get(size_t i) const {
    const unsigned char* p = bytes_.get() + i * DTypeBytes(dtype_);
    if (dtype_ == DType::kF32) {
      float v;
      std::memcpy(&v, p, sizeof(v));
      return v;
    }
    uint16_t h;
    std::memcpy(&h, p, sizeof(h));
    return dtype_ == DType::kBF16 ? kernels::Bf16ToFloat(h) : kernels::HalfToFloat(h);
  }
  bool GuardIntact() const {
    for (size_t b = count_ * DTypeBytes(dtype_); b < size_; ++b) {
      if (bytes_.get()[b] != kSentinelByte) return false;
    }
    return true;
  }

 private:
  DType dtype_;
  size_t count_;
  size_t size_;  // bytes, guard included
  std::unique_ptr<unsigned char, void (*)(void*)> bytes_;
};

// Element i of rank r's input (already representable in dtype). `salt` separates the inputs of
// different collectives issued together.
float InputValue(DType dtype, int rank, size_t i, int salt = 0);

// Checks got[offset + i] against want[i] within tol[i] (exact when tol is empty) and that the guard
// is intact. Prints rank, `what`, index, expected and actual for the first few mismatches.
void ExpectElements(int rank, const std::string& what, const HostArray& got, size_t offset,
                    const std::vector<double>& want, const std::vector<double>& tol = {});

// A one-shot latch whose waits give up after a long failsafe, so a bug fails a test instead of
// hanging it.
class Gate {
 public:
  static constexpr auto kFailsafe = std::chrono::seconds(30);

  void Open() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  // True once opened, false after the failsafe.
  bool Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, kFailsafe, [&] { return open_; });
  }
  // A stream task that blocks its stream until the gate opens.
  device::HostTask Task() {
    return [this]() -> absl::Status {
      return Wait() ? absl::OkStatus() : absl::DeadlineExceededError("conformance gate never opened");
    };
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

}  // namespace strata::comm::conformance
