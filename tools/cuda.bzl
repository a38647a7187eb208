"""cuda_library: .cu files compiled by the toolkit's nvcc, wrapped in a cc_library.

There is no rules_cuda for Bazel 4.2.3 offline, so one genrule per target runs
nvcc on each .cu (sm_89 + sm_90, -fPIC for PIE and shared test linking) and
archives the objects. Without a CUDA toolkit (HAS_CUDA False) the macro defines
nothing: BUILD files depend on CUDA targets only under `if HAS_CUDA`-style
conditional expressions.
"""

load("@local_cuda//:defs.bzl", "CUDA_PATH", "HAS_CUDA")

DEFAULT_GENCODE = [
    "arch=compute_89,code=sm_89",
    "arch=compute_90,code=sm_90",
]

def cuda_library(name, srcs, hdrs = [], deps = [], textual_hdrs = [], gencode = DEFAULT_GENCODE,
                 nvcc_flags = [], visibility = None, **kwargs):
    """Compiles CUDA sources into a static archive usable by cc_* rules.

    Args:
      name: cc_library name.
      srcs: .cu files.
      hdrs: public headers (plain C++; also visible to nvcc).
      deps: cc deps to link (their headers are not seen by nvcc: use textual_hdrs).
      textual_hdrs: extra headers nvcc reads.
      gencode: -gencode values.
      nvcc_flags: extra nvcc flags.
      visibility: visibility.
      **kwargs: passed to cc_library.
    """
    if not HAS_CUDA:
        return
    lib = "lib%s_cuda.a" % name
    flags = [
        "-std=c++20",
        "-O3",
        "-Xcompiler", "-fPIC",
        "-I.",
        "-I$(GENDIR)",
        "-I%s/include" % CUDA_PATH,
    ] + ["-gencode " + g for g in gencode] + nvcc_flags
    cmds = ["set -e", "OBJDIR=$$(mktemp -d)"]
    for i, src in enumerate(srcs):
        cmds.append("%s/bin/nvcc -c %s -o $$OBJDIR/%d.o $(location %s)" % (CUDA_PATH, " ".join(flags), i, src))
    cmds.append("%s/bin/nvcc -lib -o $@ $$OBJDIR/*.o" % CUDA_PATH)
    cmds.append("rm -rf $$OBJDIR")
    native.genrule(
        name = name + "_nvcc",
        srcs = srcs + hdrs + textual_hdrs,
        outs = [lib],
        cmd = "; ".join(cmds),
        message = "nvcc %s" % name,
        visibility = ["//visibility:private"],
    )
    native.cc_library(
        name = name,
        srcs = [lib],
        hdrs = hdrs,
        deps = deps + ["@local_cuda//:cudart"],
        visibility = visibility,
        **kwargs
    )
