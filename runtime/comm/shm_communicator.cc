#include "runtime/comm/shm_communicator.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <csignal>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/base/status.h"
#include "runtime/comm/host_communicator.h"
#include "runtime/device/host_device.h"

namespace strata::comm {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr uint64_t kMagic = 0x5354524154415348ull;  // "STRATASH"
constexpr size_t kNoticeBytes = 2048;               // a notice's longest text
constexpr size_t kRecordBytes = 512;                // a segment's name, or a rank's error, in an exchange
constexpr auto kNoticeGrace = milliseconds(200);    // Note [Shared-memory rounds]: a noticed wait polls this long
constexpr auto kLivenessEvery = milliseconds(100);  // how often a wait checks its missing peers' pids
constexpr auto kLongestSleep = milliseconds(20);    // a sleep on the bell ends at least this often
constexpr int kSpins = 200;                         // polls before a wait yields, then sleeps
constexpr int kYields = 20;
constexpr size_t kDirectBytes = size_t{1} << 20;           // mpi_communicator.cc's kReduceChunkBytes
constexpr int kMaxDirectRanks = 8;                         // and its kMaxDirectRanks
constexpr size_t kSmallAllReduceBytes = size_t{64} << 10;  // below it an all-reduce is one round

static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<uint64_t>::is_always_lock_free,
              "the segment's counters must be lock-free to work across processes");

// Whether process `pid` of this pid namespace has ended: gone, or a zombie its parent has not reaped yet (a
// launcher such as torchrun reaps its workers only when it next polls them, and kill(pid, 0) succeeds on a zombie).
bool HasExited(pid_t pid) {
  if (kill(pid, 0) != 0) return errno == ESRCH;
  std::ifstream f(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t name_end = stat.rfind(')');  // "pid (comm) S ...": comm may hold spaces and parentheses
  if (name_end == std::string::npos || name_end + 2 >= stat.size()) return false;  // gone between the calls: later
  const char state = stat[name_end + 2];
  return state == 'Z' || state == 'X';
}

// The kinds a round header names: the collectives, then the exchanges of Split (Dup is one).
constexpr uint32_t kSplitKind = kNumCollectives;

const char* KindName(uint32_t kind) {
  return kind == kSplitKind ? "split" : CollectiveName(static_cast<Collective>(kind));
}

// The segment (Note [Shared-memory rounds]): this header, a RankControl per rank, then two slots per rank,
// each a RoundHeader and `slot_bytes` of data. Zero bytes are a valid initial state of every field.
struct alignas(64) SegmentHeader {
  uint64_t magic;
  uint64_t slot_bytes;
  int64_t size;
  alignas(64) std::atomic<uint32_t> bell;     // incremented by every publication: the futex the waits sleep on
  std::atomic<uint32_t> sleepers;             // waits asleep on the bell
  alignas(64) std::atomic<uint32_t> aborted;  // Abort(): 1 while `abort_text` is written, then 2
  char abort_text[kNoticeBytes];
};

struct alignas(64) RankControl {
  std::atomic<uint64_t> posted;               // rounds this rank published
  alignas(64) std::atomic<uint64_t> done;     // rounds this rank finished reading
  alignas(64) std::atomic<uint32_t> noticed;  // Note [Failure notices]: 1 while `notice` is written, then 2
  int32_t world_rank;                         // written once, before the communicator is made
  int64_t pid;
  char notice[kNoticeBytes];
};

struct alignas(64) RoundHeader {  // what a slot's round is part of; compared on a collective's first round
  uint32_t kind;
  uint32_t dtype;
  uint32_t op;
  int32_t root;
  uint64_t count;
  uint64_t seq;
  bool operator==(const RoundHeader&) const = default;
};

std::string Describe(const RoundHeader& h) {
  if (h.kind == kSplitKind) return absl::StrCat("split #", h.seq);
  const auto kind = static_cast<Collective>(h.kind);
  std::string s = absl::StrCat(KindName(h.kind), " #", h.seq);
  if (kind == Collective::kBarrier) return s;
  absl::StrAppend(&s, " (count=", h.count, ", ", DTypeName(static_cast<DType>(h.dtype)));
  if (kind == Collective::kReduceScatter || kind == Collective::kAllReduce) {
    absl::StrAppend(&s, h.op == static_cast<uint32_t>(ReduceOp::kAvg) ? ", avg" : ", sum");
  }
  if (kind == Collective::kBroadcast) absl::StrAppend(&s, ", root ", h.root);
  return s + ")";
}

size_t RoundUp64(size_t n) { return (n + 63) / 64 * 64; }

long Futex(std::atomic<uint32_t>* word, int op, uint32_t val, const timespec* timeout) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, val, timeout, nullptr, 0);
}

void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

std::string ErrnoText(int err) { return absl::StrCat(std::strerror(err), " (errno ", err, ")"); }

// One rank's mapping of a segment.
class Segment {
 public:
  static size_t BytesFor(int size, size_t slot_bytes) {
    return RoundUp64(sizeof(SegmentHeader)) + static_cast<size_t>(size) * sizeof(RankControl) +
           2 * static_cast<size_t>(size) * (sizeof(RoundHeader) + slot_bytes);
  }

  // Creates `name` (exclusive), sized and backed for `size` ranks, and maps it.
  static absl::StatusOr<std::unique_ptr<Segment>> Create(const std::string& name, int size, size_t slot_bytes) {
    const size_t bytes = BytesFor(size, slot_bytes);
    const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) return Failed("create", name, bytes, errno);
    // Backed now, so that a /dev/shm too small is this error, not a SIGBUS in the middle of a collective.
    int err = ftruncate(fd, static_cast<off_t>(bytes)) == 0 ? posix_fallocate(fd, 0, static_cast<off_t>(bytes)) : errno;
    if (err != 0) {
      close(fd);
      shm_unlink(name.c_str());
      return Failed("size", name, bytes, err);
    }
    auto seg = Map(fd, name, bytes);
    if (!seg.ok()) {
      shm_unlink(name.c_str());
      return seg.status();
    }
    SegmentHeader& h = (*seg)->header();
    h.magic = kMagic;
    h.slot_bytes = slot_bytes;
    h.size = size;
    return seg;
  }

  static absl::StatusOr<std::unique_ptr<Segment>> Open(const std::string& name, int size, size_t slot_bytes) {
    const size_t bytes = BytesFor(size, slot_bytes);
    const int fd = shm_open(name.c_str(), O_RDWR, 0600);
    if (fd < 0) return Failed("open", name, bytes, errno);
    struct stat st {};
    if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != bytes) {
      close(fd);
      return absl::FailedPreconditionError(
          absl::StrCat("the shared segment ", name, " has ", st.st_size, " bytes where ", bytes, " were expected"));
    }
    STRATA_ASSIGN_OR_RETURN(auto seg, Map(fd, name, bytes));
    const SegmentHeader& h = seg->header();
    if (h.magic != kMagic || h.slot_bytes != slot_bytes || h.size != size) {
      return absl::FailedPreconditionError(
          absl::StrCat("the shared segment ", name, " is not the one its creator made"));
    }
    return seg;
  }

  ~Segment() { munmap(base_, bytes_); }
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  SegmentHeader& header() const { return *reinterpret_cast<SegmentHeader*>(base_); }
  RankControl& control(int r) const {
    return reinterpret_cast<RankControl*>(base_ + RoundUp64(sizeof(SegmentHeader)))[r];
  }
  // Rank r's slot for round k: its header, then its data.
  RoundHeader& round(int r, uint64_t k) const { return *reinterpret_cast<RoundHeader*>(SlotBase(r, k)); }
  char* data(int r, uint64_t k) const { return SlotBase(r, k) + sizeof(RoundHeader); }
  size_t slot_bytes() const { return header().slot_bytes; }

  // Rings the bell: wakes every wait asleep on it.
  void Ring() const {
    header().bell.fetch_add(1);
    if (header().sleepers.load() > 0) Futex(&header().bell, FUTEX_WAKE, INT_MAX, nullptr);
  }

 private:
  Segment(char* base, size_t bytes) : base_(base), bytes_(bytes) {}

  static absl::StatusOr<std::unique_ptr<Segment>> Map(int fd, const std::string& name, size_t bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int err = errno;
    close(fd);
    if (p == MAP_FAILED) return Failed("map", name, bytes, err);
    return std::unique_ptr<Segment>(new Segment(static_cast<char*>(p), bytes));
  }

  static absl::Status Failed(const char* what, const std::string& name, size_t bytes, int err) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot ", what, " the shared segment ", name, " (", bytes, " bytes) in /dev/shm: ", ErrnoText(err),
        "; the ranks of this host need a writable /dev/shm with room for it (a container may need --shm-size)"));
  }

  char* SlotBase(int r, uint64_t k) const {
    const int size = static_cast<int>(header().size);
    const size_t first = RoundUp64(sizeof(SegmentHeader)) + static_cast<size_t>(size) * sizeof(RankControl);
    const size_t slot = sizeof(RoundHeader) + header().slot_bytes;
    return base_ + first + (2 * static_cast<size_t>(r) + k % 2) * slot;
  }

  char* base_;
  size_t bytes_;
};

std::string RandomSegmentName() {
  static std::atomic<uint64_t> made{0};
  std::random_device rd;
  return absl::StrCat("/strata-", getpid(), "-", made.fetch_add(1), "-", rd(), rd());
}

// A text of at most kRecordBytes - 1 bytes in a zeroed record.
std::vector<char> Record(const std::string& text) {
  std::vector<char> r(kRecordBytes, 0);
  std::memcpy(r.data(), text.data(), std::min(text.size(), kRecordBytes - 1));
  return r;
}
std::string FromRecord(const char* r) { return std::string(r, strnlen(r, kRecordBytes)); }

// The collectives that agree on a segment: an all-gather of kRecordBytes per rank, over the bootstrap or
// over a communicator being split.
using GatherRecords = std::function<absl::Status(const char* mine, char* all)>;

// Collective over the `size` ranks that `gather` reaches, of which this is `rank`: the ranks of each group
// (those with one `leader`, a rank of the gather) map one new segment for `group_size` ranks, made by the
// leader, who unlinks it once every rank of the gather has mapped its own or failed. Every rank fails alike
// when one does.
absl::StatusOr<std::shared_ptr<Segment>> AgreeOnSegment(const GatherRecords& gather, int rank, int size, int leader,
                                                        int group_size, size_t slot_bytes) {
  std::string created;
  std::shared_ptr<Segment> seg;
  std::string mine;
  if (rank == leader) {
    created = RandomSegmentName();
    auto made = Segment::Create(created, group_size, slot_bytes);
    if (made.ok()) {
      seg = std::move(*made);
      mine = created;
    } else {
      created.clear();
      mine = absl::StrCat("!", made.status().message());
    }
  }
  std::vector<char> all(kRecordBytes * static_cast<size_t>(size));
  absl::Status s = gather(Record(mine).data(), all.data());
  std::string error;
  if (s.ok()) {
    const std::string name = FromRecord(all.data() + static_cast<size_t>(leader) * kRecordBytes);
    if (!name.empty() && name[0] == '!') {
      error = absl::StrCat("rank ", leader, ": ", name.substr(1));
    } else if (rank != leader) {
      auto opened = Segment::Open(name, group_size, slot_bytes);
      if (opened.ok()) {
        seg = std::move(*opened);
      } else {
        error = absl::StrCat("rank ", rank, ": ", opened.status().message());
      }
    }
    // Every rank's outcome: the barrier after which the leader unlinks the name.
    s = gather(Record(error).data(), all.data());
  }
  if (!created.empty()) shm_unlink(created.c_str());
  if (!s.ok()) return s;
  std::vector<std::string> errors;
  for (int q = 0; q < size; ++q) {
    const std::string e = FromRecord(all.data() + static_cast<size_t>(q) * kRecordBytes);
    if (!e.empty() && std::find(errors.begin(), errors.end(), e) == errors.end()) errors.push_back(e);
  }
  if (!errors.empty()) return absl::FailedPreconditionError(absl::StrJoin(errors, "; "));
  return seg;
}

class ShmCommunicator final : public HostCommunicator {
 public:
  ShmCommunicator(std::shared_ptr<Segment> seg, std::shared_ptr<Segment> root, int rank, int size, bool check_pids,
                  Options options)
      : seg_(std::move(seg)),
        root_(std::move(root)),
        rank_(rank),
        size_(size),
        check_pids_(check_pids),
        options_(std::move(options)) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const Options& options() const override { return options_; }

  absl::StatusOr<std::unique_ptr<Communicator>> Dup(const std::string& name, int64_t timeout_ms) override {
    return Split(0, rank_, name, timeout_ms);
  }

  // Every rank's (color, key) in an all-gather over this communicator, then a segment per color, made by
  // the color's new rank 0 (AgreeOnSegment, over this communicator too): every step has this
  // communicator's deadline and names who failed.
  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key, const std::string& name,
                                                      int64_t timeout_ms) override {
    const RoundHeader header{kSplitKind, 0, 0, 0, kRecordBytes, splits_++};
    const std::string label = Label(header);
    GatherRecords gather = [&](const char* mine, char* all) {
      return Gather(header, mine, all, kRecordBytes, Clock::now() + milliseconds(options_.timeout_ms));
    };
    std::vector<char> all(kRecordBytes * static_cast<size_t>(size_));
    STRATA_RETURN_IF_ERROR(gather(Record(absl::StrCat(color, " ", key)).data(), all.data()));
    std::vector<int> colors(size_), keys(size_);
    for (int q = 0; q < size_; ++q) {
      const std::string text = FromRecord(all.data() + static_cast<size_t>(q) * kRecordBytes);
      if (std::sscanf(text.c_str(), "%d %d", &colors[q], &keys[q]) != 2) {
        return absl::InternalError(absl::StrCat(label, ": rank ", q, " sent '", text, "' for its color and key"));
      }
    }
    for (int q = 0; q < size_; ++q) {
      if (colors[q] < 0) {
        return absl::InvalidArgumentError(absl::StrCat("Split('", name, "') of '", options_.name, "': rank ", q,
                                                       " passed color ", colors[q], "; colors must be >= 0"));
      }
    }
    std::vector<int> members;  // this rank's color, in (key, rank) order
    for (int q = 0; q < size_; ++q) {
      if (colors[q] == color) members.push_back(q);
    }
    std::stable_sort(members.begin(), members.end(), [&](int a, int b) { return keys[a] < keys[b]; });
    const int new_rank = static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
    STRATA_ASSIGN_OR_RETURN(
        std::shared_ptr<Segment> seg,
        AgreeOnSegment(gather, rank_, size_, members[0], static_cast<int>(members.size()), seg_->slot_bytes()));
    // Mapped by every rank of every part (the last exchange): each fills in its own control block. A peer
    // reads them only after this communicator's next round, which orders them.
    RankControl& mine = seg->control(new_rank);
    mine.world_rank = seg_->control(rank_).world_rank;
    mine.pid = seg_->control(rank_).pid;
    STRATA_RETURN_IF_ERROR(gather(Record("").data(), all.data()));
    Options o = options_;
    o.name = name;
    if (timeout_ms > 0) o.timeout_ms = timeout_ms;
    return std::unique_ptr<Communicator>(new ShmCommunicator(
        std::move(seg), root_, new_rank, static_cast<int>(members.size()), check_pids_, std::move(o)));
  }

  // Fails every later collective of every communicator split from the same root, on every rank.
  void Abort(const absl::Status& cause) override {
    SegmentHeader& h = root_->header();
    uint32_t expected = 0;
    if (!h.aborted.compare_exchange_strong(expected, 1)) return;
    const std::string text =
        absl::StrCat("rank ", seg_->control(rank_).world_rank, " aborted the job: ", cause.message());
    std::memcpy(h.abort_text, text.data(), std::min(text.size(), kNoticeBytes - 1));
    h.aborted.store(2);
    root_->Ring();
    seg_->Ring();
  }

  // Note [Failure notices], Note [Shared-memory rounds]: the flag and message of this rank in the segment.
  void NotifyFailure(const absl::Status& cause) override { Notice(std::string(cause.message())); }

 protected:
  absl::Status RunAllGather(const void* send, void* recv, size_t count, DType dtype, uint64_t seq) override {
    const RoundHeader h = Header(Collective::kAllGather, count, dtype, ReduceOp::kSum, 0, seq);
    return Gather(h, send, recv, count * DTypeBytes(dtype), Deadline());
  }

  absl::Status RunReduceScatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                                uint64_t seq) override {
    const RoundHeader h = Header(Collective::kReduceScatter, count, dtype, op, 0, seq);
    const bool direct = count * DTypeBytes(dtype) >= kDirectBytes && size_ <= kMaxDirectRanks;
    return Reduce(h, static_cast<const char*>(send), static_cast<char*>(recv), size_ * count, count, direct, Deadline(),
                  /*first=*/true);
  }

  absl::Status RunAllReduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                            uint64_t seq) override {
    const RoundHeader h = Header(Collective::kAllReduce, count, dtype, op, 0, seq);
    const size_t esz = DTypeBytes(dtype), block = (count + size_ - 1) / size_;
    const bool direct = block * esz >= kDirectBytes && size_ <= kMaxDirectRanks;  // Note [Shared-memory sums]
    const auto deadline = Deadline();
    char* out = static_cast<char*>(recv);
    if (count * esz <= std::min(kSmallAllReduceBytes, seg_->slot_bytes())) {
      // One round: every rank sums every element, in the same order, so to the same bits.
      return Reduce(h, static_cast<const char*>(send), out, count, count, direct, deadline, true, /*whole=*/true);
    }
    const size_t first = std::min(count, rank_ * block);
    STRATA_RETURN_IF_ERROR(
        Reduce(h, static_cast<const char*>(send), out + first * esz, count, block, direct, deadline, true));
    // The summed blocks to every rank, a slot at a time.
    const size_t block_bytes = block * esz, slot = seg_->slot_bytes();
    const size_t rounds = std::max<size_t>(1, (block_bytes + slot - 1) / slot);
    auto bytes_of = [&](int q) { return (std::min(count, (q + 1) * block) - std::min(count, q * block)) * esz; };
    for (size_t k = 0; k < rounds; ++k) {
      const size_t off = k * slot;
      STRATA_ASSIGN_OR_RETURN(char* mine, Open(h, deadline));
      const size_t n_mine = off < bytes_of(rank_) ? std::min(slot, bytes_of(rank_) - off) : 0;
      if (n_mine > 0) std::memcpy(mine, out + first * esz + off, n_mine);
      STRATA_RETURN_IF_ERROR(Exchange(h, false, deadline));
      for (int q = 0; q < size_; ++q) {
        const size_t n = off < bytes_of(q) ? std::min(slot, bytes_of(q) - off) : 0;
        if (q != rank_ && n > 0) std::memcpy(out + std::min(count, q * block) * esz + off, Slot(q), n);
      }
      Close();
    }
    return absl::OkStatus();
  }

  absl::Status RunBroadcast(void* buf, size_t count, DType dtype, int root, uint64_t seq) override {
    if (root < 0 || root >= size_) {
      return absl::InvalidArgumentError(absl::StrCat("broadcast root ", root, " is not a rank of ", size_));
    }
    const RoundHeader h = Header(Collective::kBroadcast, count, dtype, ReduceOp::kSum, root, seq);
    const auto deadline = Deadline();
    const size_t bytes = count * DTypeBytes(dtype), slot = seg_->slot_bytes();
    const size_t rounds = std::max<size_t>(1, (bytes + slot - 1) / slot);
    char* p = static_cast<char*>(buf);
    for (size_t k = 0; k < rounds; ++k) {
      const size_t off = k * slot, n = bytes == 0 ? 0 : std::min(slot, bytes - off);
      STRATA_ASSIGN_OR_RETURN(char* mine, Open(h, deadline));
      if (rank_ == root && n > 0) std::memcpy(mine, p + off, n);
      STRATA_RETURN_IF_ERROR(Exchange(h, k == 0, deadline));
      if (rank_ != root && n > 0) std::memcpy(p + off, Slot(root), n);
      Close();
    }
    return absl::OkStatus();
  }

  absl::Status RunBarrier(uint64_t seq) override {
    const RoundHeader h = Header(Collective::kBarrier, 0, DType::kF32, ReduceOp::kSum, 0, seq);
    const auto deadline = Deadline();
    STRATA_RETURN_IF_ERROR(Open(h, deadline).status());
    STRATA_RETURN_IF_ERROR(Exchange(h, true, deadline));
    Close();
    return absl::OkStatus();
  }

 private:
  static RoundHeader Header(Collective c, size_t count, DType dtype, ReduceOp op, int root, uint64_t seq) {
    return RoundHeader{
        static_cast<uint32_t>(c), static_cast<uint32_t>(dtype), static_cast<uint32_t>(op), root, count, seq};
  }
  Clock::time_point Deadline() const { return Clock::now() + milliseconds(options_.timeout_ms); }
  std::string Label(const RoundHeader& h) const {
    return absl::StrCat(KindName(h.kind), " #", h.seq, " on '", options_.name, "' (rank ", rank_, " of ", size_, ")");
  }

  // `bytes` of every rank's `send` into `recv` at rank * bytes, a slot at a time.
  absl::Status Gather(const RoundHeader& h, const void* send, void* recv, size_t bytes, Clock::time_point deadline) {
    const size_t slot = seg_->slot_bytes(), rounds = std::max<size_t>(1, (bytes + slot - 1) / slot);
    const char* in = static_cast<const char*>(send);
    char* out = static_cast<char*>(recv);
    const bool in_place = in == out + rank_ * bytes;
    for (size_t k = 0; k < rounds; ++k) {
      const size_t off = k * slot, n = bytes == 0 ? 0 : std::min(slot, bytes - off);
      STRATA_ASSIGN_OR_RETURN(char* mine, Open(h, deadline));
      if (n > 0) std::memcpy(mine, in + off, n);
      STRATA_RETURN_IF_ERROR(Exchange(h, k == 0, deadline));
      for (int q = 0; q < size_ && n > 0; ++q) {
        char* dst = out + q * bytes + off;
        if (q != rank_) {
          std::memcpy(dst, Slot(q), n);
        } else if (!in_place) {
          std::memcpy(dst, in + off, n);
        }
      }
      Close();
    }
    return absl::OkStatus();
  }

  // The reduction of Note [Shared-memory sums] over `total` elements of every rank's `in`, in blocks of
  // `block` (block q: elements [q * block, min((q + 1) * block, total))): this rank's block, summed (and
  // averaged), lands in `out`, which may be that block of `in` (in place). Each round carries, from every
  // rank, a piece of every block: the slot holds `size` pieces. `whole`: every rank sums all of `in` (one
  // block, total <= the slot) into `out`.
  absl::Status Reduce(const RoundHeader& h, const char* in, char* out, size_t total, size_t block, bool direct,
                      Clock::time_point deadline, bool first, bool whole = false) {
    const auto dtype = static_cast<DType>(h.dtype);
    const size_t esz = DTypeBytes(dtype);
    const int parts = whole ? 1 : size_;
    const size_t piece = std::max<size_t>(1, seg_->slot_bytes() / static_cast<size_t>(parts) / esz);
    auto len_of = [&](int q) { return whole ? total : std::min(total, (q + 1) * block) - std::min(total, q * block); };
    const size_t rounds = std::max<size_t>(1, (len_of(0) + piece - 1) / piece);
    const int target = whole ? 0 : rank_;
    // This rank's own part of its block is read where it is, unless the sum overwrites it (in place): only
    // this rank reads that piece of its slot.
    const char* own = in + std::min(total, rank_ * block) * esz;
    const bool own_in_slot = whole || out == own;
    std::vector<const char*> srcs(size_);
    for (size_t k = 0; k < rounds; ++k) {
      const size_t at = k * piece;
      auto n_of = [&](int q) { return at < len_of(q) ? std::min(piece, len_of(q) - at) : size_t{0}; };
      STRATA_ASSIGN_OR_RETURN(char* mine, Open(h, deadline));
      for (int q = 0; q < parts; ++q) {
        if (const size_t n = n_of(q); n > 0 && (q != target || own_in_slot)) {
          std::memcpy(mine + q * piece * esz, in + (std::min(total, q * block) + at) * esz, n * esz);
        }
      }
      STRATA_RETURN_IF_ERROR(Exchange(h, first && k == 0, deadline));
      const size_t n = n_of(target);
      for (int q = 0; q < size_; ++q) srcs[q] = Slot(q) + target * piece * esz;
      if (!own_in_slot) srcs[rank_] = own + at * esz;
      Sum(srcs, out + at * esz, n, dtype, direct);
      if (h.op == static_cast<uint32_t>(ReduceOp::kAvg) && n > 0) {
        ScaleInPlace(out + at * esz, n, dtype, 1.0f / static_cast<float>(size_));
      }
      Close();
    }
    return absl::OkStatus();
  }

  // Note [Shared-memory sums]: dst = the sum of srcs[0..size) (none of which is dst), in rank order when
  // `direct`, else pairwise: (s0 + s1) + (s2 + s3), ...
  void Sum(const std::vector<const char*>& srcs, char* dst, size_t n, DType dtype, bool direct) {
    if (n == 0) return;
    const size_t bytes = n * DTypeBytes(dtype);
    std::memcpy(dst, srcs[0], bytes);
    if (direct || size_ <= 2) {
      for (int q = 1; q < size_; ++q) AccumulateInto(dst, srcs[q], n, dtype);
      return;
    }
    if (scratch_.size() < static_cast<size_t>(size_) * bytes) scratch_.resize(static_cast<size_t>(size_) * bytes);
    std::vector<const char*> part(srcs.begin(), srcs.end());
    std::vector<char*> acc(size_, nullptr);  // acc[i]: where part i is summed, once it is a sum
    acc[0] = dst;
    for (int step = 1; step < size_; step *= 2) {
      for (int i = 0; i + step < size_; i += 2 * step) {
        if (acc[i] == nullptr) {
          acc[i] = scratch_.data() + static_cast<size_t>(i) * bytes;
          std::memcpy(acc[i], part[i], bytes);
        }
        AccumulateInto(acc[i], acc[i + step] != nullptr ? acc[i + step] : part[i + step], n, dtype);
      }
    }
  }

  // Note [Shared-memory rounds]: waits until this rank's slot for the next round is free, and writes its
  // header; returns the slot's data.
  absl::StatusOr<char*> Open(const RoundHeader& h, Clock::time_point deadline) {
    STRATA_RETURN_IF_ERROR(Broken());
    const uint64_t k = round_;
    if (k >= 2) {
      auto behind = [&](int q) { return seg_->control(q).done.load(std::memory_order_acquire) + 1 < k; };
      STRATA_RETURN_IF_ERROR(Await(h, behind, deadline, "to finish reading the previous round"));
    }
    seg_->round(rank_, k) = h;
    return seg_->data(rank_, k);
  }

  // Publishes this rank's slot and waits for every rank's; `first`: the collective's first round, whose
  // headers must all be this rank's.
  absl::Status Exchange(const RoundHeader& h, bool first, Clock::time_point deadline) {
    const uint64_t k = round_;
    seg_->control(rank_).posted.store(k + 1);
    seg_->Ring();
    auto absent = [&](int q) { return seg_->control(q).posted.load(std::memory_order_acquire) <= k; };
    STRATA_RETURN_IF_ERROR(Await(h, absent, deadline, "to join it"));
    if (!first) return absl::OkStatus();
    for (int q = 0; q < size_; ++q) {
      const RoundHeader theirs = seg_->round(q, k);
      if (!(theirs == h)) {
        Close();  // every rank sees the same headers, so every rank fails this round and the next one is shared
        return absl::InvalidArgumentError(absl::StrCat("collective mismatch at ", Label(h), ": rank ", rank_,
                                                       " called ", Describe(h), " but rank ", q, " called ",
                                                       Describe(theirs)));
      }
    }
    return absl::OkStatus();
  }

  const char* Slot(int q) const { return seg_->data(q, round_); }

  void Close() {
    seg_->control(rank_).done.store(++round_);
    seg_->Ring();
  }

  absl::Status Broken() {
    std::lock_guard<std::mutex> lock(mu_);
    return broken_;
  }
  absl::Status Break(absl::Status s) {
    std::lock_guard<std::mutex> lock(mu_);
    if (broken_.ok()) broken_ = std::move(s);
    return broken_;
  }

  // Raises this rank's flag with `text`, once.
  void Notice(const std::string& text) {
    RankControl& c = seg_->control(rank_);
    uint32_t expected = 0;
    if (!c.noticed.compare_exchange_strong(expected, 1)) return;
    std::memcpy(c.notice, text.data(), std::min(text.size(), kNoticeBytes - 1));
    c.noticed.store(2);
    seg_->Ring();
  }

  // Why the wait of `h` must end now, short of a timeout: an abort, a peer's notice after its grace, a peer
  // among `missing` whose process is gone; else OK.
  absl::Status Interrupted(const RoundHeader& h, const std::vector<int>& missing, Clock::time_point now,
                           Clock::time_point* noticed_at, Clock::time_point* next_liveness) {
    const SegmentHeader& root = root_->header();
    if (root.aborted.load(std::memory_order_acquire) == 2) {
      return absl::AbortedError(std::string(root.abort_text, strnlen(root.abort_text, kNoticeBytes)));
    }
    for (int q : missing) {  // a peer that joined this round may still fail after it; the round completes
      const RankControl& c = seg_->control(q);
      if (c.noticed.load(std::memory_order_acquire) != 2) continue;
      if (*noticed_at == Clock::time_point{}) *noticed_at = now;
      if (now - *noticed_at >= kNoticeGrace) {
        return PeerFailure(Label(h), c.world_rank, std::string(c.notice, strnlen(c.notice, kNoticeBytes)));
      }
    }
    if (check_pids_ && now >= *next_liveness) {
      *next_liveness = now + kLivenessEvery;
      for (int q : missing) {
        const RankControl& c = seg_->control(q);
        if (HasExited(static_cast<pid_t>(c.pid))) {
          return PeerFailure(Label(h), c.world_rank,
                             absl::StrCat("its process (pid ", c.pid, ") has exited (rank ", q, " here)"));
        }
      }
    }
    return absl::OkStatus();
  }

  // Waits until no rank is `behind`: polls, yields, then sleeps on the bell (Note [Shared-memory rounds]).
  // A failure breaks the communicator: every later collective fails at once with it.
  template <class Behind>
  absl::Status Await(const RoundHeader& h, Behind behind, Clock::time_point deadline, const char* awaited) {
    auto ready = [&] {
      for (int q = 0; q < size_; ++q) {
        if (behind(q)) return false;
      }
      return true;
    };
    for (int i = 0; i < kSpins + kYields; ++i) {
      if (ready()) return absl::OkStatus();
      if (i < kSpins) {
        CpuRelax();
      } else {
        std::this_thread::yield();
      }
    }
    const auto start = deadline - milliseconds(options_.timeout_ms);  // the collective's (Deadline())
    Clock::time_point noticed_at{}, next_liveness = Clock::now() + kLivenessEvery;
    SegmentHeader& bell = seg_->header();
    for (;;) {
      if (ready()) return absl::OkStatus();
      const auto now = Clock::now();
      std::vector<int> missing, present;
      for (int q = 0; q < size_; ++q) (behind(q) ? missing : present).push_back(q);
      absl::Status s = Interrupted(h, missing, now, &noticed_at, &next_liveness);
      if (!s.ok()) return Break(std::move(s));
      if (now >= deadline) {
        const auto waited = std::chrono::duration_cast<milliseconds>(now - start).count();
        s = absl::DeadlineExceededError(absl::StrCat(Label(h), " timed out after ", waited, " ms waiting for rank(s) ",
                                                     absl::StrJoin(missing, ","), " ", awaited,
                                                     " (dead, stopped or stuck before this collective); rank(s) ",
                                                     absl::StrJoin(present, ","), " arrived"));
        Notice(std::string(s.message()));  // a peer arriving late fails at once with it
        return Break(std::move(s));
      }
      const uint32_t rung = bell.bell.load();
      bell.sleepers.fetch_add(1);
      if (!ready()) {
        const auto nap = std::min<Clock::duration>(deadline - now, kLongestSleep);
        const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(nap).count();
        const timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
        Futex(&bell.bell, FUTEX_WAIT, rung, &ts);
      }
      bell.sleepers.fetch_sub(1);
    }
  }

  std::shared_ptr<Segment> seg_;
  std::shared_ptr<Segment> root_;  // the first communicator's segment: its abort flag is the job's
  const int rank_;
  const int size_;
  const bool check_pids_;  // every rank shares this process's pid namespace: a missing peer's pid is checked
  const Options options_;
  uint64_t round_ = 0;         // the round this rank is in (Note [Shared-memory rounds]); on the stream's worker
  uint64_t splits_ = 0;        // numbers the Split calls
  std::vector<char> scratch_;  // the pairwise sums' partial sums
  std::mutex mu_;
  absl::Status broken_;  // sticky: a timeout, a notice or an abort ended a wait
};

// What each rank tells the others when the communicator is made.
struct Card {
  char host[256];
  char pid_namespace[64];
  int64_t pid;
  int64_t world_rank;
};
static_assert(sizeof(Card) % 2 == 0);

std::string ReadFirstLine(const char* path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
}

std::string PidNamespace() {
  char buf[64] = {};
  const ssize_t n = readlink("/proc/self/ns/pid", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

}  // namespace

std::string ThisHostId() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  return absl::StrCat(ReadFirstLine("/proc/sys/kernel/random/boot_id"), "/", name);
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateShmCommunicator(Communicator& bootstrap, const Options& options,
                                                                    const ShmConfig& config) {
  const int rank = bootstrap.rank(), size = bootstrap.size();
  if (config.slot_bytes < 64 || config.slot_bytes % 64 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the shared-memory slot must be a positive multiple of 64 bytes, not ", config.slot_bytes));
  }
  device::HostDevice dev;
  STRATA_ASSIGN_OR_RETURN(auto stream, dev.CreateStream("shm-bootstrap"));
  Card mine{};
  const std::string host = config.host_id.empty() ? ThisHostId() : config.host_id;
  std::memcpy(mine.host, host.data(), std::min(host.size(), sizeof(mine.host) - 1));
  const std::string ns = PidNamespace();
  std::memcpy(mine.pid_namespace, ns.data(), std::min(ns.size(), sizeof(mine.pid_namespace) - 1));
  mine.pid = config.pid != 0 ? config.pid : getpid();
  mine.world_rank = rank;
  std::vector<Card> cards(static_cast<size_t>(size));
  STRATA_RETURN_IF_ERROR(AllGatherBytes(bootstrap, &mine, cards.data(), sizeof(Card), *stream).Wait());
  std::map<std::string, std::vector<int>> hosts;
  bool one_pid_namespace = !ns.empty();
  for (int q = 0; q < size; ++q) {
    hosts[std::string(cards[q].host, strnlen(cards[q].host, sizeof(cards[q].host)))].push_back(q);
    one_pid_namespace = one_pid_namespace && std::string(cards[q].pid_namespace) == ns;
  }
  if (hosts.size() > 1) {
    std::vector<std::string> where;
    for (const auto& [h, ranks] : hosts)
      where.push_back(absl::StrCat("rank(s) ", absl::StrJoin(ranks, ","), " on '", h, "'"));
    return absl::FailedPreconditionError(
        absl::StrCat("the shared-memory communicator '", options.name, "' needs every rank on one host, but ",
                     absl::StrJoin(where, ", "), ": use a transport between hosts (gloo or MPI) for this job"));
  }
  GatherRecords gather = [&](const char* send, char* all) {
    return AllGatherBytes(bootstrap, send, all, kRecordBytes, *stream).Wait();
  };
  STRATA_ASSIGN_OR_RETURN(std::shared_ptr<Segment> seg, AgreeOnSegment(gather, rank, size, 0, size, config.slot_bytes));
  RankControl& control = seg->control(rank);
  control.world_rank = rank;
  control.pid = mine.pid;
  std::vector<char> all(kRecordBytes * static_cast<size_t>(size));
  STRATA_RETURN_IF_ERROR(gather(Record("").data(), all.data()));  // every rank's control block is written
  auto root = seg;
  return std::unique_ptr<Communicator>(
      new ShmCommunicator(std::move(seg), std::move(root), rank, size, one_pid_namespace, options));
}

}  // namespace strata::comm
