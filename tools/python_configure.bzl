"""python_configure: @local_python, the CPython that the `tierd` Python package is built for.

The interpreter is TIERD_PYTHON if set, else `python3` on the PATH. With its headers
(Python.h, from python3-dev) and pybind11's (pybind11-dev, /usr/include/pybind11): a
cc_library of the headers, HAS_PYTHON = True, and in defs.bzl the interpreter's path and
the extension modules' suffix (e.g. .cpython-311-x86_64-linux-gnu.so), so a test runs the
module with the interpreter it was built for. Without them: HAS_PYTHON = False, one message
at fetch time, and the package's targets are not built. Another interpreter (another
CPython minor version) is another build: `bazel build --repo_env=TIERD_PYTHON=/path/python3`.
"""

_PROBE = """
import sys, sysconfig
print(sys.executable)
print(sysconfig.get_paths()["include"])
print(sysconfig.get_config_var("EXT_SUFFIX") or ".so")
print("%d.%d" % sys.version_info[:2])
"""

def _write_empty(rctx, why):
    print("tierd: no Python package in this build: %s" % why)
    rctx.file("WORKSPACE", "workspace(name = %r)\n" % rctx.name)
    rctx.file("BUILD.bazel", """package(default_visibility = ["//visibility:public"])

# No usable Python (see defs.bzl's WHY): the tierd Python package is not built.
cc_library(name = "headers")
""")
    rctx.file("defs.bzl", "HAS_PYTHON = False\nPYTHON_BIN = ''\nEXT_SUFFIX = '.so'\nPYTHON_VERSION = ''\nWHY = %r\n" % why)

def _python_configure_impl(rctx):
    wanted = rctx.os.environ.get("TIERD_PYTHON", "python3")
    python = rctx.which(wanted) if "/" not in wanted else rctx.path(wanted)
    if not python or not python.exists:
        _write_empty(rctx, "%s not found" % wanted)
        return
    probe = rctx.execute([str(python), "-c", _PROBE])
    if probe.return_code != 0:
        _write_empty(rctx, "%s failed: %s" % (python, probe.stderr))
        return
    executable, include, suffix, version = probe.stdout.strip().split("\n")
    if not rctx.path(include + "/Python.h").exists:
        _write_empty(rctx, "no Python.h in %s (install python3-dev)" % include)
        return
    pybind11 = rctx.os.environ.get("TIERD_PYBIND11_INCLUDE", "/usr/include")
    if not rctx.path(pybind11 + "/pybind11/pybind11.h").exists:
        _write_empty(rctx, "no pybind11/pybind11.h under %s (install pybind11-dev)" % pybind11)
        return
    rctx.symlink(include, "include/python")
    rctx.symlink(pybind11 + "/pybind11", "include/pybind11/pybind11")
    rctx.file("WORKSPACE", "workspace(name = %r)\n" % rctx.name)
    rctx.file("BUILD.bazel", """package(default_visibility = ["//visibility:public"])

# Python {version}'s headers ({include}) and pybind11's; nothing linked: an extension module
# takes the interpreter's symbols when it is imported.
cc_library(
    name = "headers",
    hdrs = glob(["include/python/**/*.h", "include/pybind11/**/*.h"]),
    includes = ["include/python", "include/pybind11"],
)
""".format(version = version, include = include))
    rctx.file("defs.bzl", "HAS_PYTHON = True\nPYTHON_BIN = %r\nEXT_SUFFIX = %r\nPYTHON_VERSION = %r\nWHY = ''\n" %
                          (executable, suffix, version))

python_configure = repository_rule(
    implementation = _python_configure_impl,
    environ = ["TIERD_PYTHON", "TIERD_PYBIND11_INCLUDE", "PATH"],
    local = True,
    configure = True,
)
