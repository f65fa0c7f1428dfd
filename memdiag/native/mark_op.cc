// memdiag's mark of a collective inside a graph (memdiag/nativemarks.py): a native TensorFlow op that
// writes one fixed-size record into a process-wide lock-free ring buffer where the graph reaches it,
// instead of calling Python (tf.numpy_function). The rank's tracer reads the ring through ctypes
// (memdiag_ring_capacity / memdiag_ring_record_words / memdiag_ring_head / memdiag_ring_read).
//
// Op:   MemdiagMark(shapes: T) with T: list({int32, int64}) (any number, also none),
//       attrs key: int (an id given at trace time), kind: int (0 = begin, 1 = end). Stateful, no
//       outputs: tf.function's automatic control dependencies keep it (memdiag marks it so that it
//       orders nothing: memdiag/graphcalls.py), and it is never folded or pruned as a stateless op is.
//       MemdiagMarkThrough(through: U, shapes: T) -> U, attr record: list(int): the same record, on the
//       path of a collective's outputs (handed on unchanged) in a graph that runs only what is fetched;
//       the shapes of the `through` inputs listed in `record` follow the `shapes` inputs in the record.
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
#include <cstddef>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <vector>

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


constexpr uint64_t kSampleCapacity = 1u << 13;  // 8192 samples: 164 s at 20 ms, far beyond a drain's wait
static_assert((kSampleCapacity & (kSampleCapacity - 1)) == 0, "capacity must be a power of two");

// Everything a reader needs, in one block: in the library's own memory, or (memdiag_ring_map) in a file
// mapped shared, so that what a rank killed outright (the OOM killer, kill -9) had marked and sampled
// outlives it in the page cache and memdiag can make it into records afterwards
// (memdiag/agent/replay.py). The file's layout (offsets in bytes, native-endian int64 words):
//   0: magic "MDMARKS1"; 8: record words; 16: ring capacity; 24: sample capacity; 32: a slot's bytes;
//   64: head (records ever written); 128: sample head (samples ever written);
//   256: the ring (capacity slots: seq, then the record's words); then sample times (ns), then pages.
struct alignas(256) Header {
  char magic[8];
  int64_t record_words;
  int64_t capacity;
  int64_t sample_capacity;
  int64_t slot_bytes;
  alignas(64) std::atomic<uint64_t> head;         // index of the next record to be written
  alignas(64) std::atomic<uint64_t> sample_head;  // samples ever written
};
struct State {
  Header header;
  Slot ring[kCapacity];
  int64_t sample_t[kSampleCapacity];
  int64_t sample_pages[kSampleCapacity];
};
static_assert(sizeof(Slot) == 384, "the file's slot size");
static_assert(offsetof(Header, head) == 64 && offsetof(Header, sample_head) == 128, "the file's header");
static_assert(offsetof(State, ring) == 256, "the file's ring offset");

State g_own;                             // zero-initialised (static storage): touched by the prefaults
std::atomic<State*> g_state{&g_own};     // the block in use: g_own, or a mapped file (before any mark)

inline State& S() { return *g_state.load(std::memory_order_acquire); }

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

REGISTER_OP("MemdiagMarkThrough")
    .Input("through: U")
    .Input("shapes: T")
    .Output("out: U")
    .Attr("U: list(type) >= 1")
    .Attr("T: list({int32, int64}) >= 0")
    .Attr("key: int")
    .Attr("kind: int")
    .Attr("record: list(int) = []")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      for (int i = 0; i < c->num_outputs(); ++i) c->set_output(i, c->input(i));
      return OkStatus();
    })
    .Doc(R"doc(
memdiag: MemdiagMark's record (the `shapes` inputs' values, then the shapes of the `through` inputs
listed in `record`), its outputs the `through` inputs handed on.
)doc");

namespace {

// Write one record into the ring: the header, then each of `shapes` (an integer tensor's first values and
// element count), then each of `dims` (a tensor's shape: its dimensions and rank), in that order, as the
// record's inputs. Called first thing in a kernel's Compute: t_ns is the time the graph reached the op.
void WriteRecord(int64_t key, int64_t kind, const std::vector<const Tensor*>& shapes,
                 const std::vector<const TensorShape*>& dims) {
  const int64_t t_ns = NowNs();  // first: the time the graph reached the op
  const int64_t rss_pages = RssPages();  // and the memory then
  if (t_tid == 0) t_tid = static_cast<int64_t>(syscall(SYS_gettid));
  const int n_inputs = static_cast<int>(shapes.size() + dims.size());

  State& state = S();
  const uint64_t index = state.header.head.fetch_add(1, std::memory_order_relaxed);
  Slot& slot = state.ring[index & (kCapacity - 1)];
  slot.seq.store(2 * index + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);  // "being written" is seen before the payload

  slot.words[0].store(static_cast<int64_t>(index), std::memory_order_relaxed);
  slot.words[1].store(key, std::memory_order_relaxed);
  slot.words[2].store(kind, std::memory_order_relaxed);
  slot.words[3].store(n_inputs, std::memory_order_relaxed);
  slot.words[4].store(t_ns, std::memory_order_relaxed);
  slot.words[5].store(t_tid, std::memory_order_relaxed);
  slot.words[6].store(rss_pages, std::memory_order_relaxed);
  int i = 0;
  for (const Tensor* t : shapes) {
    if (i >= kMaxInputs) break;
    if (t->dtype() == DT_INT64) {
      PutValues<int64>(*t, slot, i);
    } else {
      PutValues<int32>(*t, slot, i);
    }
    ++i;
  }
  for (const TensorShape* shape : dims) {
    if (i >= kMaxInputs) break;
    const int rank = shape->dims();
    slot.words[kHeaderWords + i].store(rank, std::memory_order_relaxed);
    for (int j = 0; j < kMaxValues; ++j) {
      const int64_t v = j < rank ? static_cast<int64_t>(shape->dim_size(j)) : 0;
      slot.words[kHeaderWords + kMaxInputs + i * kMaxValues + j].store(v, std::memory_order_relaxed);
    }
    ++i;
  }
  for (; i < kMaxInputs; ++i) {  // a reused slot: clear what an earlier record left
    slot.words[kHeaderWords + i].store(0, std::memory_order_relaxed);
    for (int j = 0; j < kMaxValues; ++j)
      slot.words[kHeaderWords + kMaxInputs + i * kMaxValues + j].store(0, std::memory_order_relaxed);
  }
  slot.seq.store(2 * index + 2, std::memory_order_release);  // publish
}

}  // namespace

class MemdiagMarkOp : public OpKernel {
 public:
  explicit MemdiagMarkOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("key", &key_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("kind", &kind_));
  }

  void Compute(OpKernelContext* ctx) override {
    std::vector<const Tensor*> shapes;
    shapes.reserve(ctx->num_inputs());
    for (int i = 0; i < ctx->num_inputs(); ++i) shapes.push_back(&ctx->input(i));
    WriteRecord(key_, kind_, shapes, {});
  }

  bool IsExpensive() override { return false; }  // run inline by the executor, not scheduled on the pool

 private:
  int64_t key_;
  int64_t kind_;
};

// The mark on a collective's path in a graph that runs only what is fetched (a TF1 graph and a session):
// its outputs are its `through` inputs, handed on (the same buffers: nothing is copied or allocated), so
// that fetching a collective's output runs the mark, where a mark beside it and an Identity that waits
// for it were two ops. It records the `shapes` inputs' values as MemdiagMark does, then the shapes of the
// `through` inputs listed in `record` (so a shape not known when the graph was built needs no Shape op).
class MemdiagMarkThroughOp : public OpKernel {
 public:
  explicit MemdiagMarkThroughOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("key", &key_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("kind", &kind_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("record", &record_));
  }

  void Compute(OpKernelContext* ctx) override {
    OpInputList through;
    OpInputList shape_inputs;
    OP_REQUIRES_OK(ctx, ctx->input_list("through", &through));
    OP_REQUIRES_OK(ctx, ctx->input_list("shapes", &shape_inputs));
    std::vector<const Tensor*> shapes;
    shapes.reserve(shape_inputs.size());
    for (int i = 0; i < shape_inputs.size(); ++i) shapes.push_back(&shape_inputs[i]);
    std::vector<const TensorShape*> dims;
    dims.reserve(record_.size());
    for (const int64_t i : record_) {
      if (i >= 0 && i < through.size()) dims.push_back(&through[i].shape());
    }
    WriteRecord(key_, kind_, shapes, dims);
    for (int i = 0; i < through.size(); ++i) ctx->set_output(i, through[i]);  // handed on, not copied
  }

  bool IsExpensive() override { return false; }

 private:
  int64_t key_;
  int64_t kind_;
  std::vector<int64_t> record_;
};

REGISTER_KERNEL_BUILDER(Name("MemdiagMark").Device(DEVICE_CPU), MemdiagMarkOp);
// On a GPU device the shapes are read from host memory (tf.shape's outputs live there already); no
// device code runs. Untested here (CPU-only TensorFlow); harmless where no GPU device exists.
REGISTER_KERNEL_BUILDER(Name("MemdiagMark").Device(DEVICE_GPU).HostMemory("shapes"), MemdiagMarkOp);
REGISTER_KERNEL_BUILDER(Name("MemdiagMarkThrough").Device(DEVICE_CPU), MemdiagMarkThroughOp);
REGISTER_KERNEL_BUILDER(Name("MemdiagMarkThrough").Device(DEVICE_GPU).HostMemory("shapes"), MemdiagMarkThroughOp);

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
  State& state = S();
  if (state.header.head.load(std::memory_order_acquire) != 0) return static_cast<int64_t>(sizeof(state.ring));
  for (uint64_t i = 0; i < kCapacity; ++i) state.ring[i].seq.store(0, std::memory_order_relaxed);
  for (uint64_t i = 0; i < kCapacity; ++i)
    for (int w = 0; w < kRecordWords; ++w) state.ring[i].words[w].store(0, std::memory_order_relaxed);
  return static_cast<int64_t>(sizeof(state.ring));
}

// Index of the next record to be written (= number of records ever written).
__attribute__((visibility("default"))) int64_t memdiag_ring_head() {
  return static_cast<int64_t>(S().header.head.load(std::memory_order_acquire));
}

// Copy into dst (room for max records of kRecordWords int64 each) the published records with index >=
// since, in index order, starting at max(since, head - capacity) (older ones were overwritten: the
// caller sees the gap in the records' index field). Stops at the first record not yet published (a
// writer between its fetch_add and its publish) so that the caller, resuming from the last index it
// got + 1, misses nothing. Returns the number of records copied.
__attribute__((visibility("default"))) int64_t memdiag_ring_read(int64_t* dst, int64_t max, int64_t since) {
  if (dst == nullptr || max <= 0) return 0;
  const State& state = S();
  const uint64_t head = state.header.head.load(std::memory_order_acquire);
  uint64_t i = since < 0 ? 0 : static_cast<uint64_t>(since);
  if (head > kCapacity && i < head - kCapacity) i = head - kCapacity;
  int64_t n = 0;
  for (; i < head && n < max; ++i) {
    const Slot& slot = state.ring[i & (kCapacity - 1)];
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

// ---- the sampling timer (memdiag run --record-every) ----------------------------------------------
// A thread of its own that reads the resident pages every interval into a ring of (t_ns, pages) pairs, so
// that the rank's Python sampling thread need not wake at the sampling rate: it reads the samples when it
// drains the marks (memdiag.agent.sampler.MemorySampler.use_native_timer). One writer (the timer), one
// reader; the reader drops the samples the writer may have rewritten during its copy.
namespace {

std::atomic<bool> g_timer_stop{false};
std::atomic<int64_t> g_timer_cpu_ns{-1};  // the timer thread's CPU time when it ended (-1: not ended)
pthread_t g_timer_thread;
bool g_timer_running = false;              // started and not yet joined (set and read by the caller only)
int64_t g_timer_interval_ns = 0;

bool Later(const struct timespec& a, const struct timespec& b) {
  return a.tv_sec > b.tv_sec || (a.tv_sec == b.tv_sec && a.tv_nsec > b.tv_nsec);
}

void* TimerLoop(void*) {
  struct timespec next;
  clock_gettime(CLOCK_MONOTONIC, &next);
  while (!g_timer_stop.load(std::memory_order_acquire)) {
    next.tv_nsec += g_timer_interval_ns;
    while (next.tv_nsec >= 1000000000L) {
      next.tv_nsec -= 1000000000L;
      next.tv_sec += 1;
    }
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (Later(now, next)) next = now;  // fell behind (the thread was descheduled): no burst of catch-up samples
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, nullptr) != 0) {  // EINTR: sleep on
    }
    if (g_timer_stop.load(std::memory_order_acquire)) break;
    const int64_t t_ns = NowNs();
    const int64_t pages = RssPages();
    if (pages < 0) continue;
    State& state = S();
    const uint64_t i = state.header.sample_head.load(std::memory_order_relaxed);
    state.sample_t[i & (kSampleCapacity - 1)] = t_ns;
    state.sample_pages[i & (kSampleCapacity - 1)] = pages;
    state.header.sample_head.store(i + 1, std::memory_order_release);
  }
  struct timespec cpu;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu);
  g_timer_cpu_ns.store(static_cast<int64_t>(cpu.tv_sec) * 1000000000LL + cpu.tv_nsec, std::memory_order_release);
  return nullptr;
}

void ForgetTimerInChild() { g_timer_running = false; }  // a forked child has no timer thread

}  // namespace

extern "C" {

// Start the timer (every interval_ns, at least 1 ms). Returns 0; -1 where it runs already; else the
// error of pthread_create.
__attribute__((visibility("default"))) int64_t memdiag_timer_start(int64_t interval_ns) {
  if (g_timer_running) return -1;
  static const int registered = pthread_atfork(nullptr, nullptr, ForgetTimerInChild);
  (void)registered;
  g_timer_interval_ns = interval_ns < 1000000 ? 1000000 : interval_ns;
  // Write every slot once, so that the ring is resident before the timer starts, not grown by its samples
  // inside measured steps (no reader copies before the first sample is published).
  State& state = S();
  if (state.header.sample_head.load(std::memory_order_acquire) == 0) {
    for (uint64_t i = 0; i < kSampleCapacity; ++i) state.sample_t[i] = state.sample_pages[i] = 0;
  }
  g_timer_stop.store(false, std::memory_order_release);
  g_timer_cpu_ns.store(-1, std::memory_order_release);
  const int err = pthread_create(&g_timer_thread, nullptr, TimerLoop, nullptr);
  if (err != 0) return err;
  g_timer_running = true;
  return 0;
}

// Stop the timer and wait for it (at most one interval). Returns its CPU time in ns (-1: not running).
__attribute__((visibility("default"))) int64_t memdiag_timer_stop() {
  if (!g_timer_running) return -1;
  g_timer_stop.store(true, std::memory_order_release);
  pthread_join(g_timer_thread, nullptr);
  g_timer_running = false;
  return g_timer_cpu_ns.load(std::memory_order_acquire);
}

// Samples written so far (the index of the next one).
__attribute__((visibility("default"))) int64_t memdiag_timer_head() {
  return static_cast<int64_t>(S().header.sample_head.load(std::memory_order_acquire));
}

// Copy the samples with index >= since into t_ns and pages (room for max each), oldest first, from the
// oldest still held (and, where more than max are, the newest max); *first gets the index of the first
// copied, so that the caller sees a gap. Samples the writer may have rewritten during the copy are left
// out. Returns the number copied.
__attribute__((visibility("default"))) int64_t memdiag_timer_read(int64_t* t_ns, int64_t* pages, int64_t max,
                                                                 int64_t since, int64_t* first) {
  if (t_ns == nullptr || pages == nullptr || first == nullptr || max <= 0) return 0;
  const State& state = S();
  const uint64_t head = state.header.sample_head.load(std::memory_order_acquire);
  uint64_t i = since < 0 ? 0 : static_cast<uint64_t>(since);
  if (head > kSampleCapacity && i < head - kSampleCapacity) i = head - kSampleCapacity;
  if (head > i && head - i > static_cast<uint64_t>(max)) i = head - static_cast<uint64_t>(max);
  const uint64_t start = i;
  int64_t n = 0;
  for (; i < head; ++i, ++n) {
    t_ns[n] = state.sample_t[i & (kSampleCapacity - 1)];
    pages[n] = state.sample_pages[i & (kSampleCapacity - 1)];
  }
  std::atomic_thread_fence(std::memory_order_acquire);
  // Where the writer has come within a lap of the copy's start meanwhile, the oldest slots copied may have
  // been rewritten (index now is being written into the slot of now - capacity): those are dropped.
  const uint64_t now = state.header.sample_head.load(std::memory_order_acquire);
  uint64_t skip = 0;
  if (now + 1 > kSampleCapacity + start) skip = now + 1 - kSampleCapacity - start;
  if (skip >= static_cast<uint64_t>(n)) {
    *first = static_cast<int64_t>(head);
    return 0;
  }
  if (skip > 0) {
    std::memmove(t_ns, t_ns + skip, (n - skip) * sizeof(int64_t));
    std::memmove(pages, pages + skip, (n - skip) * sizeof(int64_t));
  }
  *first = static_cast<int64_t>(start + skip);
  return n - static_cast<int64_t>(skip);
}

}  // extern "C"

extern "C" {

// Move the ring and the timer's samples into the file at path (created, or emptied, and sized), mapped
// shared: they outlive this process in the page cache (the layout above). Only before the first mark
// and the timer's start, so that no record or sample is in the library's own block. Returns 0; -1 when
// marks or samples exist already; -2 when the file could not be made; -3 when it could not be mapped.
__attribute__((visibility("default"))) int64_t memdiag_ring_map(const char* path) {
  if (path == nullptr || g_timer_running || g_state.load(std::memory_order_acquire) != &g_own ||
      g_own.header.head.load(std::memory_order_acquire) != 0 ||
      g_own.header.sample_head.load(std::memory_order_acquire) != 0)
    return -1;
  const int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return -2;
  if (ftruncate(fd, static_cast<off_t>(sizeof(State))) != 0) {
    close(fd);
    return -2;
  }
  void* at = mmap(nullptr, sizeof(State), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);  // the mapping keeps the file
  if (at == MAP_FAILED) return -3;
  State* state = static_cast<State*>(at);  // zero-filled by ftruncate: no record, no sample
  std::memcpy(state->header.magic, "MDMARKS1", 8);
  state->header.record_words = kRecordWords;
  state->header.capacity = static_cast<int64_t>(kCapacity);
  state->header.sample_capacity = static_cast<int64_t>(kSampleCapacity);
  state->header.slot_bytes = static_cast<int64_t>(sizeof(Slot));
  g_state.store(state, std::memory_order_release);
  return 0;
}

}  // extern "C"
