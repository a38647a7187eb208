"""mpi_configure: @local_mpi from Debian's OpenMPI (libopenmpi-dev) if it is installed.

With `mpicc` on the PATH: a cc_library carrying MPI's headers (symlinked: they live under
/usr/lib/x86_64-linux-gnu/openmpi/include, outside the compiler's built-in directories)
and its link flags, and HAS_MPI = True in @local_mpi//:defs.bzl. Without it: an empty
target, HAS_MPI = False, and one message at fetch time (the trainers then run one process;
tools/install_deps.sh installs OpenMPI).
"""

def _words(rctx, mpicc, what):
    r = rctx.execute([str(mpicc), "--showme:" + what])
    if r.return_code != 0:
        fail("mpicc --showme:%s failed: %s" % (what, r.stderr))
    return [w for w in r.stdout.strip().split(" ") if w]

def _mpi_configure_impl(rctx):
    mpicc = rctx.which("mpicc")
    has_mpi = mpicc != None
    if has_mpi:
        incdirs = _words(rctx, mpicc, "incdirs")
        includes = []
        for i, d in enumerate(incdirs):
            rctx.symlink(d, "include%d" % i)
            includes.append("include%d" % i)
        linkopts = ["-L" + d for d in _words(rctx, mpicc, "libdirs")]
        linkopts += ["-Wl,-rpath," + d for d in _words(rctx, mpicc, "libdirs")]
        linkopts += ["-l" + l for l in _words(rctx, mpicc, "libs")]
        rctx.file("BUILD.bazel", """package(default_visibility = ["//visibility:public"])

# OpenMPI as `mpicc --showme` describes it.
cc_library(
    name = "mpi",
    hdrs = glob(["include*/**/*.h"]),
    # The C API only: no C++ bindings (deprecated, and another library to link).
    defines = ["OMPI_SKIP_MPICXX", "MPICH_SKIP_MPICXX"],
    includes = {includes},
    linkopts = {linkopts},
)
""".format(includes = repr(includes), linkopts = repr(linkopts)))
    else:
        print("tierd: no mpicc on the PATH (libopenmpi-dev): building without the MPI backend; " +
              "the trainers run one process (tools/install_deps.sh installs it).")
        rctx.file("BUILD.bazel", """package(default_visibility = ["//visibility:public"])

# No MPI was found (no mpicc on the PATH).
cc_library(name = "mpi")
""")
    rctx.file("WORKSPACE", "workspace(name = %r)\n" % rctx.name)
    rctx.file("defs.bzl", "HAS_MPI = %s\n" % has_mpi)

mpi_configure = repository_rule(
    implementation = _mpi_configure_impl,
    environ = ["PATH"],
    local = True,
    configure = True,
)
