#include "session/backend_registry.h"

#include "bonsai/error.h"
#include "kernels/ref/ref_backend.h"

namespace bonsai {

std::vector<std::string> backend_names() { return {"ref"}; }

std::unique_ptr<Backend> create_backend(const std::string& path, int n_threads) {
  (void)n_threads;
  if (path == "ref") return std::make_unique<RefBackend>();
  std::string names;
  for (const auto& n : backend_names()) names += (names.empty() ? "" : ", ") + n;
  usage_fail("unknown compute path '{}' (available: {})", path, names);
}

}  // namespace bonsai
