// A trainer's communicator for the tests of strata_comm_create_foreign: C callbacks (strata_foreign_comm)
// whose collectives are the in-process back-end's, and whose key-value store is one map per job, with knobs
// that make a rank's callbacks misbehave (fail, block past Strata's deadline, return other ranks).
#pragma once

#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/comm/in_process.h"
#include "runtime/device/host_device.h"
#include "strata/strata.h"

namespace strata::capi_test {

// What every rank's callbacks of one job share.
struct ForeignJobState {
  std::mutex mu;
  std::map<std::string, std::string> store;
  std::atomic<int> made{0}, destroyed{0};  // endpoints handed to Strata, and destroyed by it
  std::atomic<int> aborts{0};
  std::string last_abort;
  // Knobs (set before the ranks start):
  int64_t trainer_timeout_ms = 0;  // > 0: the in-process collectives' own timeout, whatever Strata asks
  int failing_rank = -1;           // this rank's all_reduce returns `failing_status` without communicating
  strata_status failing_status = STRATA_ERR_INTERNAL;
  int wrong_dup_rank = -1;  // this rank's dup returns a communicator of one more rank than it has
};

// One rank's trainer communicator: an in-process communicator, the stream its collectives are issued on.
struct ForeignUser {
  std::shared_ptr<ForeignJobState> job;
  std::unique_ptr<comm::Communicator> comm;
  device::HostDevice device;
  std::unique_ptr<device::Stream> stream;
  int size_override = 0;
};

inline strata_status ForeignReturn(const absl::Status& s, char* error, size_t capacity) {
  if (s.ok()) return STRATA_OK;
  std::snprintf(error, capacity, "%s", std::string(s.message()).c_str());
  return absl::IsDeadlineExceeded(s) ? STRATA_ERR_DEADLINE_EXCEEDED : STRATA_ERR_INTERNAL;
}

inline DType ForeignDType(int32_t d) {
  return d == STRATA_DTYPE_BF16 ? DType::kBF16 : d == STRATA_DTYPE_F16 ? DType::kF16 : DType::kF32;
}

strata_foreign_comm MakeForeign(std::unique_ptr<ForeignUser> user);

inline ForeignUser& U(void* user) { return *static_cast<ForeignUser*>(user); }

inline strata_status ForeignAllGather(void* u, const void* send, void* recv, size_t count, int32_t dtype, char* e,
                                      size_t n) {
  ForeignUser& x = U(u);
  return ForeignReturn(x.comm->AllGather(send, recv, count, ForeignDType(dtype), *x.stream).Wait(), e, n);
}

inline strata_status ForeignReduceScatter(void* u, const void* send, void* recv, size_t count, int32_t dtype, char* e,
                                          size_t n) {
  ForeignUser& x = U(u);
  return ForeignReturn(
      x.comm->ReduceScatter(send, recv, count, ForeignDType(dtype), comm::ReduceOp::kSum, *x.stream).Wait(), e, n);
}

inline strata_status ForeignAllReduce(void* u, const void* send, void* recv, size_t count, int32_t dtype, char* e,
                                      size_t n) {
  ForeignUser& x = U(u);
  if (x.job->failing_rank == x.comm->rank()) {
    std::snprintf(e, n, "planted failure of rank %d's all_reduce", x.comm->rank());
    return x.job->failing_status;
  }
  return ForeignReturn(
      x.comm->AllReduce(send, recv, count, ForeignDType(dtype), comm::ReduceOp::kSum, *x.stream).Wait(), e, n);
}

inline strata_status ForeignBroadcast(void* u, void* buf, size_t count, int32_t dtype, int32_t root, char* e,
                                      size_t n) {
  ForeignUser& x = U(u);
  return ForeignReturn(x.comm->Broadcast(buf, count, ForeignDType(dtype), root, *x.stream).Wait(), e, n);
}

inline strata_status ForeignBarrier(void* u, char* e, size_t n) {
  ForeignUser& x = U(u);
  return ForeignReturn(x.comm->Barrier(*x.stream).Wait(), e, n);
}

// A new ForeignUser over `made`, as a strata_foreign_comm into *out.
inline strata_status ForeignAdopt(ForeignUser& parent, absl::StatusOr<std::unique_ptr<comm::Communicator>> made,
                                  strata_foreign_comm* out, char* e, size_t n) {
  if (!made.ok()) return ForeignReturn(made.status(), e, n);
  auto child = std::make_unique<ForeignUser>();
  child->job = parent.job;
  child->comm = std::move(*made);
  *out = MakeForeign(std::move(child));
  return STRATA_OK;
}

inline int64_t ForeignTimeout(ForeignUser& x, int64_t asked) {
  return x.job->trainer_timeout_ms > 0 ? x.job->trainer_timeout_ms : asked;
}

inline strata_status ForeignDup(void* u, int64_t timeout_ms, strata_foreign_comm* out, char* e, size_t n) {
  ForeignUser& x = U(u);
  strata_status s = ForeignAdopt(x, x.comm->Dup("trainer-dup", ForeignTimeout(x, timeout_ms)), out, e, n);
  if (s == STRATA_OK && x.job->wrong_dup_rank == x.comm->rank()) out->size += 1;
  return s;
}

inline strata_status ForeignSplit(void* u, const int32_t* colors, const int32_t* keys, int64_t timeout_ms,
                                  strata_foreign_comm* out, char* e, size_t n) {
  ForeignUser& x = U(u);
  const int r = x.comm->rank();
  return ForeignAdopt(x, x.comm->Split(colors[r], keys[r], "trainer-split", ForeignTimeout(x, timeout_ms)), out, e, n);
}

inline void ForeignDestroy(void* u) {
  std::unique_ptr<ForeignUser> x(static_cast<ForeignUser*>(u));
  if (x->stream != nullptr) static_cast<void>(x->stream->Synchronize());
  x->job->destroyed.fetch_add(1);
}

inline strata_status ForeignKvSet(void* u, const char* key, const void* value, size_t length, char*, size_t) {
  ForeignJobState& j = *U(u).job;
  std::lock_guard<std::mutex> lock(j.mu);
  j.store[key] = std::string(static_cast<const char*>(value), length);
  return STRATA_OK;
}

inline strata_status ForeignKvGet(void* u, const char* key, void* value, size_t capacity, int64_t* out_length, char*,
                                  size_t) {
  ForeignJobState& j = *U(u).job;
  std::lock_guard<std::mutex> lock(j.mu);
  auto it = j.store.find(key);
  if (it == j.store.end()) {
    *out_length = -1;
    return STRATA_OK;
  }
  std::memcpy(value, it->second.data(), std::min(capacity, it->second.size()));
  *out_length = static_cast<int64_t>(it->second.size());
  return STRATA_OK;
}

inline void ForeignAbort(void* u, const char* reason) {
  ForeignJobState& j = *U(u).job;
  std::lock_guard<std::mutex> lock(j.mu);
  j.aborts.fetch_add(1);
  j.last_abort = reason;
}

inline strata_foreign_comm MakeForeign(std::unique_ptr<ForeignUser> user) {
  auto stream = user->device.CreateStream("trainer");
  if (!stream.ok()) std::abort();  // a host stream always starts
  user->stream = std::move(*stream);
  user->job->made.fetch_add(1);
  strata_foreign_comm c = STRATA_FOREIGN_COMM_INIT;
  c.rank = user->comm->rank();
  c.size = user->comm->size();
  c.all_gather = ForeignAllGather;
  c.reduce_scatter = ForeignReduceScatter;
  c.all_reduce = ForeignAllReduce;
  c.broadcast = ForeignBroadcast;
  c.barrier = ForeignBarrier;
  c.dup = ForeignDup;
  c.split = ForeignSplit;
  c.destroy = ForeignDestroy;
  c.kv_set = ForeignKvSet;
  c.kv_get = ForeignKvGet;
  c.abort = ForeignAbort;
  c.user = user.release();
  return c;
}

// Runs body(rank, comm) on `world` threads, each over a strata_comm_create_foreign of rank r's duplicate of
// an in-process world (timeout `timeout_ms`), then destroys them. `edit` may change each rank's struct first.
// Afterwards the in-process world is aborted, so that calls a test abandoned return, and every endpoint
// Strata was given must then be destroyed, once.
template <typename Body, typename Edit>
void RunForeignRanks(int world, int64_t timeout_ms, const std::shared_ptr<ForeignJobState>& job, Body body, Edit edit) {
  comm::Options o;
  o.name = "trainer";
  o.timeout_ms = job->trainer_timeout_ms > 0 ? job->trainer_timeout_ms : timeout_ms;
  auto group = comm::CreateInProcessGroup(world, o);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto user = std::make_unique<ForeignUser>();
      user->job = job;
      auto dup = group[r]->Dup("trainer-root", o.timeout_ms);
      ASSERT_TRUE(dup.ok()) << dup.status();
      user->comm = std::move(*dup);
      strata_foreign_comm c = MakeForeign(std::move(user));
      edit(r, &c);
      strata_comm* sc = nullptr;
      const strata_status s = strata_comm_create_foreign(&c, timeout_ms, &sc);
      ASSERT_EQ(s, STRATA_OK) << "rank " << r << ": " << strata_last_error();
      body(r, sc);
      EXPECT_EQ(strata_comm_destroy(sc), STRATA_OK) << strata_last_error();
    });
  }
  for (std::thread& t : threads) t.join();
  group[0]->Abort(absl::AbortedError("the test is over"));
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (job->destroyed.load() < job->made.load() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(job->destroyed.load(), job->made.load()) << "every foreign communicator Strata was given is destroyed";
}

template <typename Body>
void RunForeignRanks(int world, int64_t timeout_ms, const std::shared_ptr<ForeignJobState>& job, Body body) {
  RunForeignRanks(world, timeout_ms, job, body, [](int, strata_foreign_comm*) {});
}

}  // namespace strata::capi_test
