// Creates a backend by compute-path name ("ref", and the fast paths as they land).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"

namespace bonsai {

std::unique_ptr<Backend> create_backend(const std::string& path, int n_threads);
std::vector<std::string> backend_names();

}  // namespace bonsai
