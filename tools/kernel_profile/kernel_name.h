// A CUDA kernel's mangled name as a profile's reader wants it.
#ifndef TIERD_TOOLS_KERNEL_PROFILE_KERNEL_NAME_H_
#define TIERD_TOOLS_KERNEL_PROFILE_KERNEL_NAME_H_

#include <string>

namespace tierd::tools {

// Demangled, without its return type and parameter list (template arguments kept), the
// trainer's namespace and anonymous namespaces dropped, at most 100 characters. A name that does not demangle (a C
// name, cuBLAS's) is kept as it is, cut to 100.
std::string ReadableKernelName(const char* mangled);

}  // namespace tierd::tools

#endif  // TIERD_TOOLS_KERNEL_PROFILE_KERNEL_NAME_H_
