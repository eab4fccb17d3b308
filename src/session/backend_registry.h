// Creates a backend by compute-path name ("ref", and the fast paths as they land).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "bonsai/session.h"
#include "kernels/backend.h"

namespace bonsai {

// main_gpu: the CUDA device of the cuda and auto paths (the CPU and reference paths ignore it);
// check_main_gpu (bonsai/session.h) refuses one the machine does not have.
std::unique_ptr<Backend> create_backend(const std::string& path, int n_threads, int main_gpu = 0);
// backend_names(), check_backend_name() and check_main_gpu(): bonsai/session.h.

}  // namespace bonsai
