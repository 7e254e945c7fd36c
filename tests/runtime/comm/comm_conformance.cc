#include "tests/runtime/comm/comm_conformance.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/common/element_math.h"

namespace strata::comm::conformance {

// ---- HostArray, inputs, checks ----

float InputValue(DType dtype, int rank, size_t i, int salt) {
  const long long r = rank, k = static_cast<long long>(i % 100003), s = salt;
  if (dtype == DType::kF32) return static_cast<float>(((r + 1) * 7 + k * 3 + s * 5) % 13) - 6.0f;  // [-6, 6]
  const float v = static_cast<float>((r * 37 + k * 11 + s * 53) % 97 - 48) / 7.0f;              // [-6.9, 6.9]
  return dtype == DType::kBF16 ? kernels::Bf16ToFloat(kernels::FloatToBf16(v))
                               : kernels::HalfToFloat(kernels::FloatToHalf(v));
}

namespace {
ArrayMemory& Memory() {
  static ArrayMemory memory{[](size_t bytes) { return std::malloc(bytes == 0 ? 1 : bytes); }, std::free};
  return memory;
}
}  // namespace

void SetArrayMemory(ArrayMemory memory) { Memory() = memory; }
const ArrayMemory& GetArrayMemory() { return Memory(); }

void ExpectElements(int rank, const std::string& what, const HostArray& got, size_t offset,
                    const std::vector<double>& want, const std::vector<double>& tol) {
  size_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double actual = got.Get(offset + i);
    const double t = tol.empty() ? 0.0 : tol[i];
    const bool ok = t == 0.0 ? actual == want[i] : std::fabs(actual - want[i]) <= t;
    if (!ok && ++bad <= 5) {
      ADD_FAILURE() << "rank " << rank << ", " << what << ": index " << offset + i << ": expected " << want[i]
                    << (t == 0.0 ? std::string(" exactly") : absl::StrCat(" within ", t)) << ", actual "
                    << actual;
    }
  }
  if (bad > 5) ADD_FAILURE() << "rank " << rank << ", " << what << ": " << bad << " of " << want.size() << " wrong";
  EXPECT_TRUE(got.GuardIntact()) << "rank " << rank << ", " << what << ": wrote past the end of the buffer";
}

namespace {

// ---- One collective: its buffers, the call, the oracle ----

enum class Kind { kAllReduce, kAllGather, kReduceScatter, kBroadcast, kBarrier };

struct Op {
  Kind kind = Kind::kBarrier;
  DType dtype = DType::kF32;
  ReduceOp reduce = ReduceOp::kSum;
  bool in_place = false;
  size_t count = 0;  // per rank for all_gather and reduce_scatter
  int salt = 0;
  int root = 0;
  std::unique_ptr<HostArray> send, recv;
  Work work;
};

std::string Describe(const Op& op, int world) {
  static constexpr const char* kNames[] = {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier"};
  std::string s = absl::StrCat(kNames[static_cast<int>(op.kind)], op.in_place ? " (in place)" : "", " ",
                               DTypeName(op.dtype), " count=", op.count, " world=", world);
  if (op.kind == Kind::kAllReduce || op.kind == Kind::kReduceScatter) {
    absl::StrAppend(&s, op.reduce == ReduceOp::kSum ? " sum" : " avg");
  }
  if (op.kind == Kind::kBroadcast) absl::StrAppend(&s, " root=", op.root);
  return s;
}

// Allocates and fills the buffers of `op` as rank `rank` of `world`.
void Prepare(Op& op, int rank, int world) {
  const size_t n = op.count, w = static_cast<size_t>(world);
  auto fill = [&](HostArray& a, size_t first, size_t len, int src_rank, size_t src_first) {
    for (size_t i = 0; i < len; ++i) a.Set(first + i, InputValue(op.dtype, src_rank, src_first + i, op.salt));
  };
  switch (op.kind) {
    case Kind::kAllReduce:
      op.recv = std::make_unique<HostArray>(op.dtype, n);
      if (op.in_place) {
        fill(*op.recv, 0, n, rank, 0);
      } else {
        op.send = std::make_unique<HostArray>(op.dtype, n);
        fill(*op.send, 0, n, rank, 0);
      }
      return;
    case Kind::kAllGather:
      op.recv = std::make_unique<HostArray>(op.dtype, w * n);
      if (op.in_place) {
        fill(*op.recv, rank * n, n, rank, 0);
      } else {
        op.send = std::make_unique<HostArray>(op.dtype, n);
        fill(*op.send, 0, n, rank, 0);
      }
      return;
    case Kind::kReduceScatter:
      op.send = std::make_unique<HostArray>(op.dtype, w * n);
      fill(*op.send, 0, w * n, rank, 0);
      op.recv = std::make_unique<HostArray>(op.dtype, n);
      return;
    case Kind::kBroadcast:
      op.recv = std::make_unique<HostArray>(op.dtype, n);  // non-roots keep the sentinel until written
      if (rank == op.root) fill(*op.recv, 0, n, rank, 0);
      return;
    case Kind::kBarrier:
      return;
  }
}

Work Issue(Communicator& c, device::Stream& s, Op& op) {
  const size_t n = op.count;
  switch (op.kind) {
    case Kind::kAllReduce:
      return c.AllReduce(op.in_place ? op.recv->data() : op.send->data(), op.recv->data(), n, op.dtype, op.reduce, s);
    case Kind::kAllGather:
      return c.AllGather(op.in_place ? op.recv->at(c.rank() * n) : op.send->data(), op.recv->data(), n, op.dtype, s);
    case Kind::kReduceScatter:
      return c.ReduceScatter(op.send->data(), op.recv->data(), n, op.dtype, op.reduce, s);
    case Kind::kBroadcast:
      return c.Broadcast(op.recv->data(), n, op.dtype, op.root, s);
    case Kind::kBarrier:
      return c.Barrier(s);
  }
  return Work();
}

// Note [bf16 tolerance]. Inputs are exact bf16 values. A sum over `world` ranks rounds at most
// world - 1 times, each partial sum is at most S = sum_r |x_r| in magnitude and each rounding errs by
// at most 2^-8 relative (bf16 has 8 significand bits), so |got - exact| <= (world - 1) 2^-8 S; the
// average rounds once more after scaling by 1/world. We allow (world + 1) 2^-8 S, divided by world
// for the average. fp32 sums of the small-integer inputs are exact; the fp32 average errs by the
// rounding of 1/world and of the product, so 4 FLT_EPSILON relative.
double ReduceTolerance(DType dtype, ReduceOp reduce, int world, double want, double sum_abs) {
  if (dtype == DType::kF32) return reduce == ReduceOp::kSum ? 0.0 : 4 * FLT_EPSILON * std::fabs(want) + 1e-30;
  const double bound = (world + 1) * std::ldexp(1.0, -8) * sum_abs + 1e-30;
  return reduce == ReduceOp::kSum ? bound : bound / world;
}

// The oracle for `op`'s receive buffer as rank `rank` of `world`.
void Oracle(const Op& op, int rank, int world, std::vector<double>* want, std::vector<double>* tol) {
  const size_t n = op.count;
  auto reduced = [&](size_t index) {
    double sum = 0, sum_abs = 0;
    for (int r = 0; r < world; ++r) {
      const double v = InputValue(op.dtype, r, index, op.salt);
      sum += v;
      sum_abs += std::fabs(v);
    }
    const double w = op.reduce == ReduceOp::kSum ? sum : sum / world;
    want->push_back(w);
    tol->push_back(ReduceTolerance(op.dtype, op.reduce, world, w, sum_abs));
  };
  switch (op.kind) {
    case Kind::kAllReduce:
      for (size_t i = 0; i < n; ++i) reduced(i);
      return;
    case Kind::kReduceScatter:
      for (size_t i = 0; i < n; ++i) reduced(rank * n + i);
      return;
    case Kind::kAllGather:
      for (int r = 0; r < world; ++r) {
        for (size_t i = 0; i < n; ++i) want->push_back(InputValue(op.dtype, r, i, op.salt));
      }
      return;
    case Kind::kBroadcast:
      for (size_t i = 0; i < n; ++i) want->push_back(InputValue(op.dtype, op.root, i, op.salt));
      return;
    case Kind::kBarrier:
      return;
  }
}

// Checks a completed op: its Work's status, the receive buffer against the oracle, and that the send
// buffer was left untouched.
void Check(const Op& op, int rank, int world, const std::string& where = "") {
  const std::string what = absl::StrCat(Describe(op, world), where);
  const absl::Status st = op.work.Wait();
  EXPECT_TRUE(st.ok()) << "rank " << rank << ", " << what << ": " << st;
  EXPECT_TRUE(op.work.Done()) << "rank " << rank << ", " << what << ": Done() false after Wait()";
  if (op.kind == Kind::kBarrier) return;
  std::vector<double> want, tol;
  Oracle(op, rank, world, &want, &tol);
  ExpectElements(rank, what, *op.recv, 0, want, tol);
  if (op.send != nullptr) {
    std::vector<double> sent;
    for (size_t i = 0; i < op.send->count(); ++i) sent.push_back(InputValue(op.dtype, rank, i, op.salt));
    ExpectElements(rank, what + " send buffer (must be left untouched)", *op.send, 0, sent);
  }
}

// Prepares, issues, waits for and checks one op on the harness stream.
void RunOne(RankHarness& h, Op op) {
  Prepare(op, h.comm.rank(), h.comm.size());
  op.work = Issue(h.comm, h.stream, op);
  Check(op, h.comm.rank(), h.comm.size());
}

constexpr DType kDTypes[] = {DType::kF32, DType::kBF16};
constexpr ReduceOp kReduceOps[] = {ReduceOp::kSum, ReduceOp::kAvg};

void AllGatherBody(RankHarness& h, bool in_place) {
  for (DType dtype : kDTypes) {
    for (size_t count : kCounts)
      RunOne(h, Op{.kind = Kind::kAllGather, .dtype = dtype, .in_place = in_place, .count = count});
  }
}

void ReduceBody(RankHarness& h, Kind kind, bool in_place) {
  for (DType dtype : kDTypes) {
    for (ReduceOp reduce : kReduceOps) {
      for (size_t count : kCounts) {
        RunOne(h, Op{.kind = kind, .dtype = dtype, .reduce = reduce, .in_place = in_place, .count = count});
      }
    }
  }
}

// Blocks of several MiB: back-ends that move a reduction in pieces (the MPI back-end's 1 MiB transfers,
// Note [Reduce-scatter over point to point]) cross piece boundaries mid-block and end on a partial one.
// Both dtypes and both ops, not every pair: each op is ~7 s at 4 ranks under TSan.
void LargeReduceScatterBody(RankHarness& h) {
  constexpr size_t kCount = (5u << 20) / 8 + 3;  // 2.5 MiB + 12 B of fp32 per block (1.25 MiB + 6 B of bf16)
  RunOne(h, Op{.kind = Kind::kReduceScatter, .dtype = DType::kF32, .reduce = ReduceOp::kSum, .count = kCount});
  RunOne(h, Op{.kind = Kind::kReduceScatter, .dtype = DType::kBF16, .reduce = ReduceOp::kAvg, .count = kCount});
}

// The same for the all-reduce (Note [All-reduce over point to point]): 9 MiB of fp32 and a few elements,
// so that at 2-4 ranks each rank's block is over 1 MiB, several pieces long, and the last block shorter.
void LargeAllReduceBody(RankHarness& h) {
  constexpr size_t kCount = (9u << 20) / 4 + 5;
  RunOne(h, Op{.kind = Kind::kAllReduce, .dtype = DType::kF32, .reduce = ReduceOp::kSum, .count = kCount});
  RunOne(h, Op{.kind = Kind::kAllReduce, .dtype = DType::kBF16, .reduce = ReduceOp::kAvg, .in_place = true,
               .count = kCount});
}

void BroadcastBody(RankHarness& h) {
  for (int root = 0; root < h.comm.size(); ++root) {
    for (DType dtype : kDTypes) {
      for (size_t count : kCounts)
        RunOne(h, Op{.kind = Kind::kBroadcast, .dtype = dtype, .count = count, .root = root});
    }
  }
}

// AllGatherBytes / BroadcastBytes deliver bytes exactly: every 16-bit pattern (fp16 NaNs, signalling
// ones and subnormals included), since no back-end may do arithmetic on them.
void BytesBody(RankHarness& h) {
  constexpr size_t kPatterns = 65536;
  const int n = h.comm.size(), rank = h.comm.rank();
  auto pattern = [](int r, size_t i) { return static_cast<uint16_t>(i + 7919 * static_cast<size_t>(r)); };
  HostArray send(DType::kF16, kPatterns), recv(DType::kF16, kPatterns * n), buf(DType::kF16, kPatterns);
  for (size_t i = 0; i < kPatterns; ++i) {
    const uint16_t v = pattern(rank, i);
    std::memcpy(send.at(i), &v, 2);
    std::memcpy(buf.at(i), &v, 2);
  }
  const absl::Status gathered = AllGatherBytes(h.comm, send.data(), recv.data(), 2 * kPatterns, h.stream).Wait();
  const absl::Status broadcast = BroadcastBytes(h.comm, buf.data(), 2 * kPatterns, n - 1, h.stream).Wait();
  EXPECT_TRUE(gathered.ok()) << "rank " << rank << ": " << gathered;
  EXPECT_TRUE(broadcast.ok()) << "rank " << rank << ": " << broadcast;
  size_t wrong_gather = 0, wrong_broadcast = 0;
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < kPatterns; ++i) {
      uint16_t got;
      std::memcpy(&got, recv.at(r * kPatterns + i), 2);
      wrong_gather += got != pattern(r, i);
    }
  }
  for (size_t i = 0; i < kPatterns; ++i) {
    uint16_t got;
    std::memcpy(&got, buf.at(i), 2);
    wrong_broadcast += got != pattern(n - 1, i);
  }
  EXPECT_EQ(wrong_gather, 0u) << "rank " << rank << ": all_gather bytes changed";
  EXPECT_EQ(wrong_broadcast, 0u) << "rank " << rank << ": broadcast bytes changed";
  EXPECT_TRUE(recv.GuardIntact() && buf.GuardIntact()) << "rank " << rank << ": wrote past the end";
}

void BarrierBody(RankHarness& h) {
  for (int i = 0; i < 5; ++i) RunOne(h, Op{.kind = Kind::kBarrier});
}

// Many collectives of every kind in flight on one stream, waited for once at the end.
void ManyOutstandingBody(RankHarness& h) {
  const int rank = h.comm.rank(), world = h.comm.size();
  std::vector<Op> ops(40);
  for (int k = 0; k < 40; ++k) {
    Op& op = ops[k];
    op.kind = static_cast<Kind>(k % 5);
    op.dtype = kDTypes[(k / 5) % 2];
    op.reduce = kReduceOps[(k / 10) % 2];
    op.count = static_cast<size_t>(3 * k + 1);
    op.salt = k;
    op.root = k % world;
    Prepare(op, rank, world);
    op.work = Issue(h.comm, h.stream, op);
  }
  const absl::Status st = h.stream.Synchronize();
  EXPECT_TRUE(st.ok()) << "rank " << rank << ": " << st;
  for (int k = 0; k < 40; ++k) Check(ops[k], rank, world, absl::StrCat(" (op ", k, " of 40 outstanding)"));
}

void DupBody(RankHarness& h) {
  auto dup = h.comm.Dup("dup_for_test");
  ASSERT_TRUE(dup.ok()) << "rank " << h.comm.rank() << ": " << dup.status();
  Communicator& d = **dup;
  EXPECT_EQ(d.rank(), h.comm.rank());
  EXPECT_EQ(d.size(), h.comm.size());
  EXPECT_EQ(d.options().name, "dup_for_test");
  EXPECT_EQ(d.options().timeout_ms, h.comm.options().timeout_ms) << "a Dup keeps the parent's timeout";
  RankHarness on_dup{d, h.device, h.stream};
  RunOne(on_dup, Op{.kind = Kind::kAllReduce, .count = 33, .salt = 1});
  RunOne(h, Op{.kind = Kind::kAllGather, .count = 5, .salt = 2});  // the parent is unaffected
  RunOne(on_dup, Op{.kind = Kind::kReduceScatter, .count = 9, .salt = 3});
}

// Split by parity, ranked in reverse: each part holds the ranks of one parity, highest first. The
// part's collectives are checked against the oracle of its own size and ranks, and an all-gather of
// the parent ranks shows who is in it.
void SplitBody(RankHarness& h) {
  const int rank = h.comm.rank(), world = h.comm.size();
  auto part = h.comm.Split(rank % 2, world - rank, "parity");
  ASSERT_TRUE(part.ok()) << "rank " << rank << ": " << part.status();
  Communicator& p = **part;
  std::vector<int> members;  // the expected parent ranks of the part, in its rank order
  for (int r = world - 1; r >= 0; --r) {
    if (r % 2 == rank % 2) members.push_back(r);
  }
  EXPECT_EQ(p.size(), static_cast<int>(members.size())) << "rank " << rank;
  EXPECT_EQ(p.rank(), static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin()))
      << "rank " << rank;
  EXPECT_EQ(p.options().name, "parity");
  EXPECT_EQ(p.options().timeout_ms, h.comm.options().timeout_ms) << "a Split keeps the parent's timeout";
  HostArray who(DType::kF32, static_cast<size_t>(p.size()));
  HostArray mine(DType::kF32, 1);
  mine.Set(0, static_cast<float>(rank));
  EXPECT_TRUE(p.AllGather(mine.data(), who.data(), 1, DType::kF32, h.stream).Wait().ok());
  std::vector<double> want(members.begin(), members.end());
  ExpectElements(rank, "parent ranks of the split's members", who, 0, want);
  RankHarness on_part{p, h.device, h.stream};
  RunOne(on_part, Op{.kind = Kind::kAllReduce, .count = 33, .salt = 1});
  RunOne(h, Op{.kind = Kind::kAllGather, .count = 5, .salt = 2});  // the parent is unaffected
  RunOne(on_part, Op{.kind = Kind::kReduceScatter, .count = 9, .salt = 3});
  RunOne(on_part, Op{.kind = Kind::kAllGather, .dtype = DType::kBF16, .count = 7, .salt = 4});
  // One color for all is a Dup with a new order; a part splits again, with its own timeout.
  auto all = h.comm.Split(0, rank, "all", 12345);
  ASSERT_TRUE(all.ok()) << "rank " << rank << ": " << all.status();
  EXPECT_EQ((*all)->size(), world);
  EXPECT_EQ((*all)->rank(), rank);
  EXPECT_EQ((*all)->options().timeout_ms, 12345);
  auto single = p.Split(p.rank(), 0, "single");
  ASSERT_TRUE(single.ok()) << "rank " << rank << ": " << single.status();
  EXPECT_EQ((*single)->size(), 1);
  EXPECT_EQ((*single)->rank(), 0);
  RankHarness on_all{**all, h.device, h.stream}, on_single{**single, h.device, h.stream};
  RunOne(on_all, Op{.kind = Kind::kAllReduce, .count = 10, .salt = 5});
  RunOne(on_single, Op{.kind = Kind::kAllReduce, .count = 10, .salt = 6});
}

// A negative color fails the split (on every rank where the back-end exchanges the colors first; at
// one rank, or on the host back-ends, that is everywhere this case runs).
void SplitBadColorBody(RankHarness& h) {
  if (h.comm.device_buffers() && h.comm.size() > 1) GTEST_SKIP() << "NCCL's peers of a bad color time out";
  auto part = h.comm.Split(h.comm.rank() == 0 ? -1 : 0, 0, "bad");
  EXPECT_TRUE(absl::IsInvalidArgument(part.status())) << "rank " << h.comm.rank() << ": " << part.status();
  RunOne(h, Op{.kind = Kind::kAllReduce, .count = 10, .salt = 7});  // the parent still works
}

// Note [Traffic]: a fresh communicator counts each collective's payload as issued, per kind; its
// parent's counter does not move.
void TrafficBody(RankHarness& h) {
  const int rank = h.comm.rank();
  const uint64_t n = static_cast<uint64_t>(h.comm.size());
  auto dup = h.comm.Dup("counted");
  ASSERT_TRUE(dup.ok()) << "rank " << rank << ": " << dup.status();
  const Traffic parent_before = h.comm.traffic();
  Communicator& d = **dup;
  RankHarness on_dup{d, h.device, h.stream};
  EXPECT_EQ(d.traffic().total_bytes(), 0u);
  RunOne(on_dup, Op{.kind = Kind::kAllGather, .count = 5, .salt = 1});
  RunOne(on_dup, Op{.kind = Kind::kReduceScatter, .dtype = DType::kBF16, .count = 9, .salt = 2});
  RunOne(on_dup, Op{.kind = Kind::kAllReduce, .count = 33, .salt = 3});
  RunOne(on_dup, Op{.kind = Kind::kAllReduce, .count = 3, .salt = 4});
  RunOne(on_dup, Op{.kind = Kind::kBroadcast, .dtype = DType::kBF16, .count = 7, .salt = 5});
  EXPECT_TRUE(d.Barrier(h.stream).Wait().ok());
  const Traffic t = d.traffic();
  EXPECT_EQ(t.calls_of(Collective::kAllGather), 1u) << "rank " << rank;
  EXPECT_EQ(t.bytes_of(Collective::kAllGather), n * 5 * 4) << "rank " << rank;
  EXPECT_EQ(t.calls_of(Collective::kReduceScatter), 1u) << "rank " << rank;
  EXPECT_EQ(t.bytes_of(Collective::kReduceScatter), n * 9 * 2) << "rank " << rank;
  EXPECT_EQ(t.calls_of(Collective::kAllReduce), 2u) << "rank " << rank;
  EXPECT_EQ(t.bytes_of(Collective::kAllReduce), (33u + 3u) * 4) << "rank " << rank;
  EXPECT_EQ(t.bytes_of(Collective::kBroadcast), 7u * 2) << "rank " << rank;
  EXPECT_EQ(t.calls_of(Collective::kBarrier), 1u) << "rank " << rank;
  EXPECT_EQ(t.bytes_of(Collective::kBarrier), 0u) << "rank " << rank;
  EXPECT_EQ(t.total_bytes(), n * 5 * 4 + n * 9 * 2 + 36 * 4 + 14) << "rank " << rank;
  EXPECT_EQ((h.comm.traffic() - parent_before).total_bytes(), 0u) << "rank " << rank << ": the parent counted a Dup's";
}

// Two Dup()s driven from two streams at once. Every rank issues its collectives in a different host
// order (even ranks interleave the streams, odd ranks issue all of B first), and rank 0 holds stream A
// back until its B collectives have completed. So B's collectives must complete on every rank while A
// is pending somewhere, which a single shared ordering (or streams that do not progress independently)
// would deadlock on.
void TwoDupsBody(RankHarness& h) {
  const int rank = h.comm.rank(), world = h.comm.size();
  auto da = h.comm.Dup("dup_a");
  auto db = h.comm.Dup("dup_b");
  ASSERT_TRUE(da.ok() && db.ok()) << "rank " << rank << ": " << da.status() << " / " << db.status();
  Gate hold_a;
  auto sa = h.device.CreateStream("a");
  auto sb = h.device.CreateStream("b");
  ASSERT_TRUE(sa.ok() && sb.ok());
  constexpr int kOps = 6;
  std::vector<Op> a(kOps), b(kOps);
  for (int k = 0; k < kOps; ++k) {
    a[k] = Op{.kind = k % 2 ? Kind::kAllGather : Kind::kAllReduce, .count = size_t(31 + 50 * k), .salt = 10 + k};
    b[k] = Op{.kind = k % 2 ? Kind::kReduceScatter : Kind::kAllGather, .count = size_t(17 + 9 * k), .salt = 20 + k};
    Prepare(a[k], rank, world);
    Prepare(b[k], rank, world);
  }
  if (rank == 0) (*sa)->Enqueue(hold_a.Task());
  auto issue_a = [&](int k) { a[k].work = Issue(**da, **sa, a[k]); };
  auto issue_b = [&](int k) { b[k].work = Issue(**db, **sb, b[k]); };
  if (rank % 2 == 0) {
    for (int k = 0; k < kOps; ++k) {
      issue_a(k);
      issue_b(k);
    }
  } else {
    for (int k = 0; k < kOps; ++k) issue_b(k);
    for (int k = 0; k < kOps; ++k) issue_a(k);
  }
  if (rank == 0) {
    for (int k = 0; k < kOps; ++k) Check(b[k], rank, world, " on dup_b (while rank 0 holds dup_a back)");
    EXPECT_FALSE(a[0].work.Done()) << "rank 0: stream a ran past its closed gate";
    hold_a.Open();
  }
  for (int k = 0; k < kOps; ++k) Check(a[k], rank, world, " on dup_a");
  for (int k = 0; k < kOps; ++k) Check(b[k], rank, world, " on dup_b");
  EXPECT_TRUE((*sa)->Synchronize().ok());
  EXPECT_TRUE((*sb)->Synchronize().ok());
}

// Work::StreamWait orders a consumer stream after the collective without blocking the host; Work::Wait
// and Done() observe the same completion from every copy.
void WorkBody(RankHarness& h) {
  const int rank = h.comm.rank(), world = h.comm.size();
  EXPECT_TRUE(Work().Wait().ok()) << "a default Work is complete";
  EXPECT_TRUE(Work().Done());
  Gate hold;
  auto consumer = h.device.CreateStream("consumer");
  ASSERT_TRUE(consumer.ok());
  // Out of place, so the collective writes recv even at world size 1 (where an in-place one may do nothing).
  Op op{.kind = Kind::kAllReduce, .count = 64, .salt = 7};
  Prepare(op, rank, world);
  h.stream.Enqueue(hold.Task());  // the collective cannot start before the gate opens
  op.work = Issue(h.comm, h.stream, op);
  const Work copy = op.work;
  copy.StreamWait(**consumer);
  std::vector<double> seen(op.count);
  (*consumer)->Enqueue([&] {
    for (size_t i = 0; i < op.count; ++i) seen[i] = op.recv->Get(i);
    return absl::OkStatus();
  });
  EXPECT_FALSE(copy.Done()) << "rank " << rank << ": collective reported done behind a closed gate";
  hold.Open();
  const absl::Status cs = (*consumer)->Synchronize();
  EXPECT_TRUE(cs.ok()) << "rank " << rank << ": " << cs;
  EXPECT_TRUE(copy.Done()) << "rank " << rank << ": consumer ran before the collective completed";
  std::vector<double> want, tol;
  Oracle(op, rank, world, &want, &tol);
  for (size_t i = 0; i < op.count; ++i) {
    EXPECT_EQ(seen[i], want[i]) << "rank " << rank << ", consumer stream after StreamWait: index " << i
                                << ": expected " << want[i] << ", actual " << seen[i];
  }
  Check(op, rank, world);
}

// A broadcast root outside the world is InvalidArgument on every rank (no communication, no hang),
// and the failure is sticky on that stream only.
void BadRootBody(RankHarness& h) {
  const int rank = h.comm.rank(), world = h.comm.size();
  auto bad = h.device.CreateStream("bad");
  ASSERT_TRUE(bad.ok());
  HostArray buf(DType::kF32, 4);
  const absl::Status s1 = h.comm.Broadcast(buf.data(), 4, DType::kF32, world, **bad).Wait();
  EXPECT_EQ(s1.code(), absl::StatusCode::kInvalidArgument) << "rank " << rank << ": " << s1;
  EXPECT_NE(s1.message().find(absl::StrCat("root ", world)), absl::string_view::npos) << s1;
  const absl::Status s2 = h.comm.Broadcast(buf.data(), 4, DType::kF32, -1, **bad).Wait();
  EXPECT_EQ(s2.code(), absl::StatusCode::kInvalidArgument) << "rank " << rank << ": " << s2;
  const absl::Status s3 = h.comm.Barrier(**bad).Wait();
  EXPECT_EQ(s3, s1) << "rank " << rank << ": a later collective on the failed stream must return the first error";
  EXPECT_EQ((*bad)->Synchronize(), s1);
  RunOne(h, Op{.kind = Kind::kAllReduce, .count = 10, .salt = 4});  // the communicator itself still works
}

// Note [Failure notices]: the last rank says it failed and issues nothing; every other rank's collective on
// that communicator (a Dup, so the notice leaves the suite's communicator alone) ends at once with an
// AbortedError carrying the cause, long before the deadline, and so does the next one.
void NotifyFailureBody(RankHarness& h) {
  const int rank = h.comm.rank(), world = h.comm.size();
  if (world == 1) return;
  if (h.comm.device_buffers()) GTEST_SKIP() << "NCCL's communicator sends no notices (its peers time out)";
  auto dup = h.comm.Dup("noticed", 600000);  // a deadline no test waits for
  ASSERT_TRUE(dup.ok()) << dup.status();
  auto stream = h.device.CreateStream("noticed");
  ASSERT_TRUE(stream.ok());
  if (rank == world - 1) {
    (*dup)->NotifyFailure(absl::InternalError("planted failure of the last rank"));
    (*dup)->NotifyFailure(absl::InternalError("a second cause, never sent"));
  } else {
    HostArray send(DType::kF32, 4), recv(DType::kF32, 4 * static_cast<size_t>(world));
    const auto start = std::chrono::steady_clock::now();
    const absl::Status s = (*dup)->AllGather(send.data(), recv.data(), 4, DType::kF32, **stream).Wait();
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << "rank " << rank << ": " << s;
    EXPECT_TRUE(IsPeerFailure(s)) << "rank " << rank << ": " << s;
    EXPECT_NE(s.message().find("planted failure of the last rank"), absl::string_view::npos) << s;
    EXPECT_NE(s.message().find("failed and will not join it"), absl::string_view::npos) << s;
    EXPECT_LT(secs, 5.0) << "rank " << rank << ": the notice must end the wait, not the deadline";
    auto again = h.device.CreateStream("noticed-again");
    ASSERT_TRUE(again.ok());
    const absl::Status s2 = (*dup)->Barrier(**again).Wait();
    EXPECT_EQ(s2.code(), absl::StatusCode::kAborted) << "rank " << rank << ": a later collective: " << s2;
  }
  RunOne(h, Op{.kind = Kind::kAllReduce, .count = 10, .salt = 5});  // the suite's communicator is untouched
}

}  // namespace

const std::vector<Case>& Cases() {
  static const std::vector<Case> kCases = {
      {"AllGather", [](RankHarness& h) { AllGatherBody(h, false); }},
      {"AllGatherInPlace", [](RankHarness& h) { AllGatherBody(h, true); }},
      {"ReduceScatter", [](RankHarness& h) { ReduceBody(h, Kind::kReduceScatter, false); }},
      {"ReduceScatterOfSeveralMiB", LargeReduceScatterBody},
      {"AllReduceOfSeveralMiB", LargeAllReduceBody},
      {"AllReduce", [](RankHarness& h) { ReduceBody(h, Kind::kAllReduce, false); }},
      {"AllReduceInPlace", [](RankHarness& h) { ReduceBody(h, Kind::kAllReduce, true); }},
      {"BroadcastFromEachRoot", BroadcastBody},
      {"Barrier", BarrierBody},
      {"BytesArriveExactly", BytesBody},
      {"ManyOutstandingCollectivesOnOneStream", ManyOutstandingBody},
      {"DupHasSameRanksAndItsOwnName", DupBody},
      {"TwoDupsOnTwoStreamsInDifferentOrders", TwoDupsBody},
      {"SplitByColorRanksByKey", SplitBody},
      {"SplitWithNegativeColorFails", SplitBadColorBody},
      {"TrafficCountsEachCollectivesPayload", TrafficBody},
      {"WorkWaitAndStreamWait", WorkBody},
      {"BroadcastRootOutsideWorldFailsStickyOnThatStream", BadRootBody},
      {"NotifyFailureEndsThePeersWaitsAtOnce", NotifyFailureBody},
  };
  return kCases;
}

}  // namespace strata::comm::conformance
