#!/usr/bin/env bash
# mpirun for tests on one machine: -np N ranks here, even past the core count, as root too
# (CI containers), shared memory between ranks; the rest of the line is mpirun's.
#   comm/mpirun_local.sh -np 4 bazel-bin/comm/mpi_collectives_check
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Under AddressSanitizer: OpenMPI 4.1 leaves its own allocations at MPI_Finalize (op tables,
# plugins), which LeakSanitizer reports; the ranks' leaks are not checked, everything else is.
if [ -n "${ASAN_OPTIONS:-}" ]; then export ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=0"; fi
# Keep OpenMPI's session files in the test's temp dir (the sandbox's /tmp may be read-only).
export OMPI_MCA_orte_tmpdir_base="${TEST_TMPDIR:-${TMPDIR:-/tmp}}"
exec mpirun --oversubscribe --bind-to none --mca btl self,vader --mca btl_vader_single_copy_mechanism none \
  --mca rmaps_base_oversubscribe 1 "$@"
