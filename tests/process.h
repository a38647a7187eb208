// Child processes for the multi-process tests: start a binary with arguments, read its
// stdout and stderr (merged) line by line, signal it, reap it. Deterministic enough for tests: every wait
// has a bound.
#ifndef TIERD_TESTS_PROCESS_H_
#define TIERD_TESTS_PROCESS_H_

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

namespace tierd::testing {

class Process {
 public:
  Process(const std::string& binary, const std::vector<std::string>& args) {
    int out[2];
    if (pipe2(out, O_CLOEXEC) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(out[1], 1);
      dup2(out[1], 2);
      std::vector<std::string> all = {binary};
      all.insert(all.end(), args.begin(), args.end());
      std::vector<char*> argv;
      for (auto& a : all) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(binary.c_str(), argv.data());
      _exit(127);
    }
    close(out[1]);
    out_ = out[0];
  }
  ~Process() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      Wait();
    }
    if (out_ >= 0) close(out_);
  }
  pid_t pid() const { return pid_; }

  // Reads stdout until a line starting with `prefix` (returned) or `timeout_ms` passes.
  std::string WaitForLine(const std::string& prefix, int timeout_ms) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      size_t newline;
      while ((newline = buffer_.find('\n')) != std::string::npos) {
        std::string line = buffer_.substr(0, newline);
        buffer_.erase(0, newline + 1);
        output_ += line + "\n";
        if (line.rfind(prefix, 0) == 0) return line;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                            deadline - std::chrono::steady_clock::now()).count();
      if (left <= 0) return "";
      pollfd p{out_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left)) <= 0) continue;
      char chunk[4096];
      const ssize_t n = read(out_, chunk, sizeof(chunk));
      if (n <= 0) return "";
      buffer_.append(chunk, static_cast<size_t>(n));
    }
  }
  const std::string& output() const { return output_; }

  void Signal(int signal) { kill(pid_, signal); }
  // The exit status (WEXITSTATUS) or 128 + signal.
  int Wait() {
    int status = 0;
    waitpid(pid_, &status, 0);
    reaped_ = true;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  pid_t pid_ = -1;
  int out_ = -1;
  bool reaped_ = false;
  std::string buffer_, output_;
};

// Shared-memory segments whose names start with `prefix` (a daemon's leave none behind).
inline int CountShm(const std::string& prefix) {
  int count = 0;
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return -1;
  while (dirent* entry = readdir(dir)) count += std::string(entry->d_name).rfind(prefix, 0) == 0;
  closedir(dir);
  return count;
}

}  // namespace tierd::testing

#endif  // TIERD_TESTS_PROCESS_H_
