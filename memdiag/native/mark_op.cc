// memdiag's mark of a collective inside a graph (memdiag/nativemarks.py): a native TensorFlow op that
// writes one fixed-size record into a process-wide lock-free ring buffer where the graph reaches it,
// instead of calling Python (tf.numpy_function). The rank's tracer reads the ring through ctypes
// (memdiag_ring_capacity / memdiag_ring_record_words / memdiag_ring_head / memdiag_ring_read).
//
// Op:   MemdiagMark(shapes: T) with T: list({int32, int64}) (any number, also none),
//       attrs key: int (an id given at trace time), kind: int (0 = begin, 1 = end). Stateful, no
//       outputs: tf.function's automatic control dependencies keep it (memdiag marks it so that it
//       orders nothing: memdiag/graphcalls.py), and it is never folded or pruned as a stateless op is.
// Record (kRecordWords = 43 int64 words):
//   index, key, kind, n_inputs, t_ns (CLOCK_REALTIME, the clock of Python's time.time()),
//   tid (Linux thread id of the executing thread), rss_pages (the process's resident pages, from
//   /proc/self/statm, read right after t_ns; -1 where it could not be read), count[kMaxInputs] (each
//   input's element count before truncation), values[kMaxInputs][kMaxValues] (each input flattened,
//   first 8 values; unused are 0).
//   Inputs past kMaxInputs are counted in n_inputs but not stored.
// Ring: capacity kCapacity (power of two). A writer takes a slot with an atomic fetch_add on a 64-bit
//   head (one writer per slot), marks the slot's sequence as "being written" (2*index+1), writes the
//   payload with relaxed atomic stores, and publishes it with sequence 2*index+2 (release). A reader
//   accepts a slot whose sequence is 2*index+2 both before and after its copy (seqlock), so a slot that
//   a lapping writer is rewriting is never returned torn.
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fcntl.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace {

constexpr int kMaxInputs = 4;
constexpr int kMaxValues = 8;
constexpr int kHeaderWords = 7;  // index, key, kind, n_inputs, t_ns, tid, rss_pages
constexpr int kRecordWords = kHeaderWords + kMaxInputs + kMaxInputs * kMaxValues;  // 43
// 4096 records; a slot is 384 bytes (64-aligned): 1.5 MiB. The tracer reads the ring every sampling
// interval (20 ms by default), so it holds seconds of marks at real steps' rates.
constexpr uint64_t kCapacity = 1u << 12;
static_assert((kCapacity & (kCapacity - 1)) == 0, "capacity must be a power of two");

struct alignas(64) Slot {
  std::atomic<uint64_t> seq;             // 0: never written; 2i+1: record i being written; 2i+2: i published
  std::atomic<int64_t> words[kRecordWords];
};

Slot g_ring[kCapacity];                  // zero-initialised (static storage): touched by memdiag_ring_prefault
std::atomic<uint64_t> g_head{0};         // index of the next record to be written

thread_local int64_t t_tid = 0;

// /proc/self/statm, kept open (an open and a close cost more than the read); a forked child closes the
// descriptor it inherited, which names the parent, and opens its own. Two threads opening it at once:
// one keeps its descriptor, the other closes its own.
std::atomic<int> g_statm{-1};

void ForgetStatmInChild() {
  const int inherited = g_statm.exchange(-1, std::memory_order_relaxed);
  if (inherited >= 0) close(inherited);
}

int StatmFd() {
  int fd = g_statm.load(std::memory_order_acquire);
  if (fd >= 0) return fd;
  static const int registered = pthread_atfork(nullptr, nullptr, ForgetStatmInChild);
  (void)registered;
  int opened = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
  if (opened < 0) return -1;
  int expected = -1;
  if (!g_statm.compare_exchange_strong(expected, opened, std::memory_order_acq_rel)) {
    close(opened);
    return expected;
  }
  return opened;
}

// Resident pages now (statm's second field), or -1.
inline int64_t RssPages() {
  const int fd = StatmFd();
  if (fd < 0) return -1;
  char buf[128];
  const ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
  if (n <= 0) return -1;
  buf[n] = '\0';
  char* end = nullptr;
  std::strtoll(buf, &end, 10);  // size
  if (end == buf) return -1;
  char* at = end;
  const long long resident = std::strtoll(at, &end, 10);
  return end == at ? -1 : static_cast<int64_t>(resident);
}

inline int64_t NowNs() {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

template <typename T>
inline void PutValues(const tensorflow::Tensor& t, Slot& slot, int i) {
  auto flat = t.flat<T>();
  const int64_t n = flat.size();
  slot.words[kHeaderWords + i].store(n, std::memory_order_relaxed);
  for (int j = 0; j < kMaxValues; ++j) {
    const int64_t v = j < n ? static_cast<int64_t>(flat(j)) : 0;
    slot.words[kHeaderWords + kMaxInputs + i * kMaxValues + j].store(v, std::memory_order_relaxed);
  }
}

}  // namespace

using namespace tensorflow;  // NOLINT

REGISTER_OP("MemdiagMark")
    .Input("shapes: T")
    .Attr("T: list({int32, int64}) >= 0")
    .Attr("key: int")
    .Attr("kind: int")
    .SetIsStateful()
    .SetShapeFn(shape_inference::NoOutputs)
    .Doc(R"doc(
memdiag: write one record {key, kind, CLOCK_REALTIME ns, thread, each input's first 8 values and
element count, resident pages} into the process's ring buffer, where the graph reaches this op.
)doc");

class MemdiagMarkOp : public OpKernel {
 public:
  explicit MemdiagMarkOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("key", &key_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("kind", &kind_));
  }

  void Compute(OpKernelContext* ctx) override {
    const int64_t t_ns = NowNs();  // first: the time the graph reached the op
    const int64_t rss_pages = RssPages();  // and the memory then
    if (t_tid == 0) t_tid = static_cast<int64_t>(syscall(SYS_gettid));
    const int n_inputs = ctx->num_inputs();

    const uint64_t index = g_head.fetch_add(1, std::memory_order_relaxed);
    Slot& slot = g_ring[index & (kCapacity - 1)];
    slot.seq.store(2 * index + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);  // "being written" is seen before the payload

    slot.words[0].store(static_cast<int64_t>(index), std::memory_order_relaxed);
    slot.words[1].store(key_, std::memory_order_relaxed);
    slot.words[2].store(kind_, std::memory_order_relaxed);
    slot.words[3].store(n_inputs, std::memory_order_relaxed);
    slot.words[4].store(t_ns, std::memory_order_relaxed);
    slot.words[5].store(t_tid, std::memory_order_relaxed);
    slot.words[6].store(rss_pages, std::memory_order_relaxed);
    int i = 0;
    for (; i < n_inputs && i < kMaxInputs; ++i) {
      const Tensor& t = ctx->input(i);
      if (t.dtype() == DT_INT64) {
        PutValues<int64>(t, slot, i);
      } else {
        PutValues<int32>(t, slot, i);
      }
    }
    for (; i < kMaxInputs; ++i) {  // a reused slot: clear what an earlier record left
      slot.words[kHeaderWords + i].store(0, std::memory_order_relaxed);
      for (int j = 0; j < kMaxValues; ++j)
        slot.words[kHeaderWords + kMaxInputs + i * kMaxValues + j].store(0, std::memory_order_relaxed);
    }
    slot.seq.store(2 * index + 2, std::memory_order_release);  // publish
  }

  bool IsExpensive() override { return false; }  // run inline by the executor, not scheduled on the pool

 private:
  int64_t key_;
  int64_t kind_;
};

REGISTER_KERNEL_BUILDER(Name("MemdiagMark").Device(DEVICE_CPU), MemdiagMarkOp);
// On a GPU device the shapes are read from host memory (tf.shape's outputs live there already); no
// device code runs. Untested here (CPU-only TensorFlow); harmless where no GPU device exists.
REGISTER_KERNEL_BUILDER(Name("MemdiagMark").Device(DEVICE_GPU).HostMemory("shapes"), MemdiagMarkOp);

// ---- reader side, for ctypes -------------------------------------------------------------------
extern "C" {

__attribute__((visibility("default"))) int64_t memdiag_ring_capacity() {
  return static_cast<int64_t>(kCapacity);
}

__attribute__((visibility("default"))) int64_t memdiag_ring_record_words() { return kRecordWords; }

// Write every page of the ring once (a zero sequence: "never written"), so that its memory is resident
// from the start, before the first step, instead of growing with the first marks inside measured steps.
// Does nothing once a mark has been written. Returns the ring's size in bytes.
__attribute__((visibility("default"))) int64_t memdiag_ring_prefault() {
  if (g_head.load(std::memory_order_acquire) != 0) return static_cast<int64_t>(sizeof(g_ring));
  for (uint64_t i = 0; i < kCapacity; ++i) g_ring[i].seq.store(0, std::memory_order_relaxed);
  for (uint64_t i = 0; i < kCapacity; ++i)
    for (int w = 0; w < kRecordWords; ++w) g_ring[i].words[w].store(0, std::memory_order_relaxed);
  return static_cast<int64_t>(sizeof(g_ring));
}

// Index of the next record to be written (= number of records ever written).
__attribute__((visibility("default"))) int64_t memdiag_ring_head() {
  return static_cast<int64_t>(g_head.load(std::memory_order_acquire));
}

// Copy into dst (room for max records of kRecordWords int64 each) the published records with index >=
// since, in index order, starting at max(since, head - capacity) (older ones were overwritten: the
// caller sees the gap in the records' index field). Stops at the first record not yet published (a
// writer between its fetch_add and its publish) so that the caller, resuming from the last index it
// got + 1, misses nothing. Returns the number of records copied.
__attribute__((visibility("default"))) int64_t memdiag_ring_read(int64_t* dst, int64_t max, int64_t since) {
  if (dst == nullptr || max <= 0) return 0;
  const uint64_t head = g_head.load(std::memory_order_acquire);
  uint64_t i = since < 0 ? 0 : static_cast<uint64_t>(since);
  if (head > kCapacity && i < head - kCapacity) i = head - kCapacity;
  int64_t n = 0;
  for (; i < head && n < max; ++i) {
    const Slot& slot = g_ring[i & (kCapacity - 1)];
    const uint64_t want = 2 * i + 2;
    uint64_t s1 = slot.seq.load(std::memory_order_acquire);
    if (s1 != want) {
      if (s1 > want) continue;  // already overwritten by a lapping writer: lost, skip it
      break;                    // not yet published: stop, the caller resumes here
    }
    int64_t* out = dst + n * kRecordWords;
    for (int w = 0; w < kRecordWords; ++w) out[w] = slot.words[w].load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (slot.seq.load(std::memory_order_relaxed) != want) continue;  // rewritten during the copy: lost
    ++n;
  }
  return n;
}

}  // extern "C"
