#include "trainer_ref/cpu_data_parallel.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "trainer_ref/checkpoint.h"

#ifdef TIERD_HAVE_MPI
#include "comm/mpi_communicator.h"
#endif

namespace tierd::trainer {
namespace {

// Written only between steps; read by the handler (a torn message is the worst case).
char stop_message[1024];
volatile sig_atomic_t stop_length = 0;
int stop_rank = 0, stop_ranks = 1;

void OnStop(int) {
  if (stop_length > 0) (void)!write(STDERR_FILENO, stop_message, static_cast<size_t>(stop_length));
  _exit(143);
}

// The step a checkpoint path names (DIR/ckpt-00000008.bin), or -1.
int64_t StepOf(const std::string& path) {
  const size_t at = path.rfind("ckpt-");
  int64_t step = -1;
  if (at == std::string::npos || !absl::SimpleAtoi(path.substr(at + 5, 8), &step)) return -1;
  return step;
}

}  // namespace

absl::StatusOr<std::unique_ptr<comm::Communicator>> MakeCpuCommunicator(const RunSettings& s,
                                                                        comm::LaunchInfo* launch) {
  auto info = comm::LaunchFromEnv();
  if (!info.ok()) return info.status();
  *launch = *info;
  if (info->size == 1) return std::unique_ptr<comm::Communicator>();
  if (info->launcher == "torchrun") {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s: the CPU trainer's ranks talk over MPI; start them with mpirun -np %d (or srun -n %d)",
                        info->Describe(), info->size, info->size));
  }
#ifdef TIERD_HAVE_MPI
  auto made = comm::MakeMpiCommunicator({.timeout_seconds = s.comm_timeout});
  if (!made.ok()) return made.status();
  if ((*made)->size() != info->size || (*made)->rank() != info->rank) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s, but MPI says rank %d of %d: was this binary started by another MPI's launcher?",
                        info->Describe(), (*made)->rank(), (*made)->size()));
  }
  return made;
#else
  (void)s;
  return absl::FailedPreconditionError(absl::StrFormat(
      "%s, but this tierd-train was built without MPI (no libopenmpi-dev): install it (tools/install_deps.sh) "
      "and rebuild",
      info->Describe()));
#endif
}

DataParallelOptions DataParallelFrom(const RunSettings& s, comm::Communicator* comm) {
  DataParallelOptions dp;
  dp.comm = comm;
  dp.zero2 = s.zero == 2;
  dp.zero3 = s.zero == 3;
  dp.sparse_ratio = s.sparse_ratio;
  dp.sparse_ratio_by = s.sparse_ratio_by;
  dp.sync_every = s.sync_every;
  dp.sparse_warmup = s.sparse_warmup;
  dp.sparse_update = s.sparse_update;
  dp.sparse_momentum = s.sparse_momentum;
  return dp;
}

absl::StatusOr<std::string> AgreedCheckpoint(comm::Communicator* comm, const std::string& dir) {
  std::string skipped;
  auto latest = LatestCheckpoint(dir, &skipped);
  if (!skipped.empty()) std::fprintf(stderr, "tierd-train: skipped damaged checkpoints:\n%s", skipped.c_str());
  if (comm == nullptr || comm->size() == 1) {
    struct stat st;
    if (!latest.ok() && stat((dir + "/rank-0").c_str(), &st) == 0) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s holds a data-parallel run's checkpoints (rank-0, rank-1, ...): resume it with its launcher and as "
          "many ranks (mpirun -np N tierd-train ... --resume)",
          dir));
    }
    return latest;
  }
  double step = latest.ok() ? static_cast<double>(StepOf(*latest)) : -1.0;
  const double mine = step;
  if (absl::Status s = comm->AllReduce(&step, 1, comm::ReduceOp::kMin); !s.ok()) return s;
  if (step < 0) {
    return absl::NotFoundError(
        absl::StrFormat("rank %d: %s; some rank has no checkpoint that verifies in its "
                        "rank-N folder",
                        comm->rank(), mine < 0 ? "none here in " + dir : "this rank has one"));
  }
  for (const std::string& path : ListCheckpoints(dir)) {
    if (StepOf(path) == static_cast<int64_t>(step) && VerifyCheckpoint(path).ok()) {
      if (step < mine) {
        std::printf("rank %d: resuming from step %d, the newest every rank has (this rank's newest: %d)\n",
                    comm->rank(), static_cast<int>(step), static_cast<int>(mine));
      }
      return path;
    }
  }
  return absl::NotFoundError(absl::StrFormat(
      "rank %d: the ranks' newest common checkpoint is step %d, but %s has no verified ckpt of that step (more "
      "kept with --checkpoint_keep)",
      comm->rank(), static_cast<int>(step), dir));
}

void InstallStopHandler(int rank, int ranks) {
  stop_rank = rank;
  stop_ranks = ranks;
  SetStopAdvice("no checkpoint yet");
  struct sigaction sa {};
  sa.sa_handler = OnStop;
  sigaction(SIGTERM, &sa, nullptr);
}

void SetStopAdvice(const std::string& advice) {
  stop_length = 0;
  const int n = std::snprintf(stop_message, sizeof(stop_message),
                              "tierd-train: rank %d of %d: stopped by the launcher (SIGTERM): another rank failed or "
                              "the job was cancelled\n  %s\n",
                              stop_rank, stop_ranks, advice.c_str());
  stop_length = std::min<int>(n, sizeof(stop_message) - 1);
}

}  // namespace tierd::trainer
