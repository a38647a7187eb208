"""cc_grpc_library: C++ protobuf + gRPC code from .proto files in one package.

One genrule runs Debian's /usr/bin/protoc with /usr/bin/grpc_cpp_plugin; a cc_library
wraps the output. Imports of well-known types resolve through /usr/include.
"""

PROTOC = "/usr/bin/protoc"
GRPC_CPP_PLUGIN = "/usr/bin/grpc_cpp_plugin"

def cc_grpc_library(name, srcs, deps = [], visibility = None):
    """Generates <x>.pb.{h,cc} and <x>.grpc.pb.{h,cc} for each .proto in srcs."""
    outs_h = []
    outs_cc = []
    for src in srcs:
        base = src[:-len(".proto")]
        outs_h += [base + ".pb.h", base + ".grpc.pb.h"]
        outs_cc += [base + ".pb.cc", base + ".grpc.pb.cc"]
    native.genrule(
        name = name + "_protoc",
        srcs = srcs,
        outs = outs_h + outs_cc,
        cmd = " ".join([
            PROTOC,
            "--proto_path=.",
            "--cpp_out=$(GENDIR)",
            "--plugin=protoc-gen-grpc=" + GRPC_CPP_PLUGIN,
            "--grpc_out=$(GENDIR)",
        ] + ["$(location %s)" % s for s in srcs]),
        message = "protoc + grpc_cpp_plugin %s" % native.package_name(),
    )
    native.cc_library(
        name = name,
        srcs = outs_cc,
        hdrs = outs_h,
        # Generated code is not ours to warn about.
        copts = ["-Wno-unused-parameter"],
        deps = deps + ["//third_party/system:grpcpp"],
        visibility = visibility,
    )
