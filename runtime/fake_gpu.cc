#include "runtime/fake_gpu.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "base/check.h"
#include "base/units.h"

namespace tierd {
namespace {

class FakeRegion final : public GpuRegion {
 public:
  FakeRegion(int fd, void* base, uint64_t bytes, std::function<void()> on_release)
      : fd_(fd), base_(base), bytes_(bytes), on_release_(std::move(on_release)) {}
  ~FakeRegion() override {
    munmap(base_, bytes_);
    close(fd_);
    on_release_();
  }
  void* base() const override { return base_; }
  uint64_t bytes() const override { return bytes_; }
  // The fake's "device memory" is a memfd, so another process can map it like a client
  // maps a real GPU pool (the pointer record stays zero).
  absl::StatusOr<GpuRegionExport> Export() const override {
    GpuRegionExport out;
    out.pool_fd = fcntl(fd_, F_DUPFD_CLOEXEC, 0);
    if (out.pool_fd < 0) return absl::InternalError(absl::StrFormat("dup: %s", std::strerror(errno)));
    return out;
  }

 private:
  int fd_;
  void* base_;
  uint64_t bytes_;
  std::function<void()> on_release_;
};

// One worker thread executes copies in order; fences complete when it reaches them.
class FakeCopyStream final : public CopyStream {
 public:
  FakeCopyStream(Clock& clock, double link_bytes_per_second, double within_bytes_per_second)
      : clock_(clock),
        link_bytes_per_second_(link_bytes_per_second),
        within_bytes_per_second_(within_bytes_per_second),
        worker_([this] { Run(); }) {}

  ~FakeCopyStream() override {
    {
      absl::MutexLock lock(&mutex_);
      stopping_ = true;
    }
    worker_.join();
  }

  absl::Status CopyAsync(void* dst, const void* src, uint64_t bytes, CopyDirection direction) override {
    if (dst == nullptr || src == nullptr) return absl::InvalidArgumentError("null copy address");
    absl::MutexLock lock(&mutex_);
    queue_.push_back(Op{dst, src, bytes, 0, direction == CopyDirection::kDeviceToDevice});
    return absl::OkStatus();
  }

  absl::StatusOr<uint64_t> RecordFence() override {
    absl::MutexLock lock(&mutex_);
    const uint64_t fence = ++last_fence_;
    queue_.push_back(Op{nullptr, nullptr, 0, fence, false});
    return fence;
  }

  absl::Status WaitFence(uint64_t fence) override {
    absl::MutexLock lock(&mutex_);
    if (fence > last_fence_) return absl::InvalidArgumentError("waiting on a fence never recorded");
    auto passed = [this, fence]() ABSL_SHARED_LOCKS_REQUIRED(mutex_) {
      return completed_fence_ >= fence;
    };
    mutex_.Await(absl::Condition(&passed));
    return absl::OkStatus();
  }

 private:
  struct Op {
    void* dst;
    const void* src;
    uint64_t bytes;
    uint64_t fence;  // non-zero: a fence marker, not a copy
    bool within;     // device to device: no link to model
  };

  void Run() {
    for (;;) {
      Op op;
      {
        absl::MutexLock lock(&mutex_);
        auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mutex_) {
          return stopping_ || !queue_.empty();
        };
        mutex_.Await(absl::Condition(&ready));
        if (queue_.empty()) return;  // stopping and drained
        op = queue_.front();
        queue_.pop_front();
      }
      if (op.fence != 0) {
        absl::MutexLock lock(&mutex_);
        completed_fence_ = op.fence;
        continue;
      }
      const int64_t start = clock_.NowNanos();
      std::memcpy(op.dst, op.src, op.bytes);
      const double speed = op.within ? within_bytes_per_second_ : link_bytes_per_second_;
      if (speed > 0) {
        const auto modelled = static_cast<int64_t>(1e9 * static_cast<double>(op.bytes) / speed);
        clock_.SleepNanos(modelled - (clock_.NowNanos() - start));
      }
    }
  }

  Clock& clock_;
  const double link_bytes_per_second_, within_bytes_per_second_;
  absl::Mutex mutex_;
  std::deque<Op> queue_ ABSL_GUARDED_BY(mutex_);
  uint64_t last_fence_ ABSL_GUARDED_BY(mutex_) = 0;
  uint64_t completed_fence_ ABSL_GUARDED_BY(mutex_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  std::thread worker_;
};

class FakeGpu final : public GpuDevice {
 public:
  explicit FakeGpu(const FakeGpuOptions& options)
      : options_(options), clock_(options.clock ? *options.clock : RealClock()) {}

  std::string Describe() const override {
    return options_.link_bytes_per_second > 0
               ? absl::StrFormat("fake GPU (host memory, %s, link modelled at %s)",
                                 FormatBytes(options_.memory_bytes),
                                 FormatRate(options_.link_bytes_per_second))
               : absl::StrFormat("fake GPU (host memory, %s, link at memcpy speed)",
                                 FormatBytes(options_.memory_bytes));
  }
  bool is_fake() const override { return true; }

  absl::StatusOr<uint64_t> FreeBytes() override {
    absl::MutexLock lock(&mutex_);
    return options_.memory_bytes - allocated_bytes_;
  }

  absl::StatusOr<std::unique_ptr<GpuRegion>> AllocateRegion(uint64_t bytes) override {
    absl::MutexLock lock(&mutex_);
    if (bytes == 0) return absl::InvalidArgumentError("GPU region of 0 bytes");
    if (bytes > options_.memory_bytes - allocated_bytes_) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "gpu tier: budget %s exceeds the free GPU memory (%s free of %s on %s)",
          FormatBytes(bytes), FormatBytes(options_.memory_bytes - allocated_bytes_),
          FormatBytes(options_.memory_bytes), Describe()));
    }
    const int fd = memfd_create("tierd-fake-gpu", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      const int error = errno;
      if (fd >= 0) close(fd);
      return absl::ResourceExhaustedError(absl::StrFormat(
          "fake GPU: cannot create %s of shareable host memory: %s", FormatBytes(bytes),
          std::strerror(error)));
    }
    void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    if (base == MAP_FAILED) {
      const int error = errno;
      close(fd);
      return absl::ResourceExhaustedError(absl::StrFormat(
          "fake GPU: cannot map %s of host memory: %s", FormatBytes(bytes), std::strerror(error)));
    }
    allocated_bytes_ += bytes;
    return std::unique_ptr<GpuRegion>(new FakeRegion(fd, base, bytes, [this, bytes] {
      absl::MutexLock lock(&mutex_);
      allocated_bytes_ -= bytes;
    }));
  }

  absl::Status RegisterHostMemory(void*, uint64_t) override { return absl::OkStatus(); }
  absl::Status UnregisterHostMemory(void*) override { return absl::OkStatus(); }

  absl::StatusOr<std::unique_ptr<CopyStream>> CreateCopyStream() override {
    return std::unique_ptr<CopyStream>(new FakeCopyStream(clock_, options_.link_bytes_per_second, options_.within_bytes_per_second));
  }
  absl::StatusOr<std::unique_ptr<ImportedEvent>> ImportEvent(const std::string&) override {
    return absl::UnimplementedError("the fake GPU has no interprocess events");
  }
  absl::StatusOr<std::unique_ptr<GpuFence>> FenceAfter(ImportedEvent&) override {
    return absl::UnimplementedError("the fake GPU has no interprocess events");
  }

 private:
  const FakeGpuOptions options_;
  Clock& clock_;
  absl::Mutex mutex_;
  uint64_t allocated_bytes_ ABSL_GUARDED_BY(mutex_) = 0;
};

}  // namespace

std::unique_ptr<GpuDevice> CreateFakeGpu(const FakeGpuOptions& options) {
  return std::make_unique<FakeGpu>(options);
}

}  // namespace tierd
