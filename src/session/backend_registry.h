// Creates a backend by compute-path name ("ref", and the fast paths as they land).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "bonsai/session.h"
#include "kernels/backend.h"

namespace bonsai {

std::unique_ptr<Backend> create_backend(const std::string& path, int n_threads);
// backend_names() and check_backend_name(): bonsai/session.h.

}  // namespace bonsai
