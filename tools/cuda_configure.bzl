"""cuda_configure: @local_cuda from the CUDA toolkit if it is installed.

With a toolkit (nvcc + cuda_runtime.h under TIERD_CUDA_PATH, default
/usr/local/cuda): cc_library targets for the headers, cudart and cuBLASLt, and
HAS_CUDA = True in @local_cuda//:defs.bzl (HAS_CUDNN too when cudnn.h is beside
the toolkit's headers: cuDNN's attention is built). Without one: the same targets, empty,
HAS_CUDA = False, and one message at fetch time saying the build is CPU-only
(the fake GPU is used at run time). TIERD_CUDA_PATH=none leaves a toolkit out on purpose
(tools/test_all.sh's sanitizer pass: ASan does not instrument device code, and no GPU test
runs where CI runs, so compiling every kernel again there bought nothing).
"""

_REAL_BUILD = """package(default_visibility = ["//visibility:public"])

# Every file under include/: C++ headers without an extension (nv/target, cuda/std/...)
# are included by cuda_fp16.h and friends, and the sandbox only shows declared files.
# CUDA 13 keeps CCCL (cub, thrust, libcu++, nv/) under include/cccl, which nvcc adds by
# itself and a host compiler needs told.
cc_library(
    name = "cuda_headers",
    hdrs = glob(["include/**"]),
    includes = ["include"] + (["include/cccl"] if {has_cccl} else []),
)

# Shared cudart/cuBLASLt from the toolkit; rpath so binaries run without
# LD_LIBRARY_PATH where the toolkit lives at the same path.
cc_library(
    name = "cudart",
    linkopts = ["-L{path}/lib64", "-Wl,-rpath,{path}/lib64", "-lcudart"],
    deps = [":cuda_headers"],
)

cc_library(
    name = "cublasLt",
    linkopts = ["-L{path}/lib64", "-Wl,-rpath,{path}/lib64", "-lcublasLt"],
    deps = [":cudart"],
)
"""

_EMPTY_BUILD = """package(default_visibility = ["//visibility:public"])

# No CUDA toolkit was found at {path}: CPU-only build (fake GPU).
cc_library(name = "cuda_headers")
cc_library(name = "cudart")
cc_library(name = "cublasLt")
"""

def _cuda_configure_impl(rctx):
    path = rctx.os.environ.get("TIERD_CUDA_PATH", "") or "/usr/local/cuda"
    if path == "none":
        print("tierd: TIERD_CUDA_PATH=none: building CPU-only on purpose (fake GPU).")
        rctx.file("BUILD.bazel", _EMPTY_BUILD.format(path = path))
        rctx.file("WORKSPACE", "workspace(name = %r)\n" % rctx.name)
        rctx.file("defs.bzl", "HAS_CUDA = False\nHAS_CUDNN = False\nCUDA_PATH = %r\n" % path)
        return
    nvcc = rctx.path(path + "/bin/nvcc")
    header = rctx.path(path + "/include/cuda_runtime.h")
    has_cuda = nvcc.exists and header.exists
    if has_cuda:
        rctx.symlink(path + "/include", "include")
        has_cccl = rctx.path(path + "/include/cccl").exists
        rctx.file("BUILD.bazel", _REAL_BUILD.replace("{has_cccl}", str(has_cccl)).format(path = path))
    else:
        print("tierd: no CUDA toolkit at %s (no bin/nvcc or include/cuda_runtime.h): " % path +
              "building CPU-only; the fake GPU will stand in for the GPU tier.")
        rctx.file("BUILD.bazel", _EMPTY_BUILD.format(path = path))
    rctx.file("WORKSPACE", "workspace(name = %r)\n" % rctx.name)
    # cuDNN's header beside the toolkit's: cuDNN's fused attention is built (and loaded at run
    # time where libcudnn.so.9 is found); without it, our own attention kernels only.
    has_cudnn = has_cuda and rctx.path(path + "/include/cudnn.h").exists
    rctx.file("defs.bzl", "HAS_CUDA = %s\nHAS_CUDNN = %s\nCUDA_PATH = %r\n" % (has_cuda, has_cudnn, path))

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["TIERD_CUDA_PATH"],
    local = True,
    configure = True,
)
