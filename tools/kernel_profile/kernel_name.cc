#include "tools/kernel_profile/kernel_name.h"

#include <cxxabi.h>

#include <cstdlib>
#include <cstring>

namespace tierd::tools {

std::string ReadableKernelName(const char* mangled) {
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string name = status == 0 && demangled != nullptr ? demangled : mangled;
  std::free(demangled);
  // The namespaces first: "(anonymous namespace)" holds a '(' that is not the parameter list.
  for (const char* prefix : {"tierd::trainer::gpu::", "(anonymous namespace)::"}) {
    for (size_t at; (at = name.find(prefix)) != std::string::npos;) name.erase(at, std::strlen(prefix));
  }
  int depth = 0;  // cut at the parameter list's '(' outside template arguments
  for (size_t i = 0; i < name.size(); ++i) {
    if (name[i] == '<') ++depth;
    if (name[i] == '>') --depth;
    if (name[i] == '(' && depth == 0 && i > 0) {
      name.resize(i);
      break;
    }
  }
  if (name.rfind("void ", 0) == 0) name.erase(0, 5);  // a template function's return type
  if (name.size() > 100) name = name.substr(0, 97) + "...";
  return name;
}

}  // namespace tierd::tools
