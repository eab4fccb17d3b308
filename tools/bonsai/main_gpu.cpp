// -mg / --main-gpu: the CUDA device, shared by run, chat, gate and bench (llama.cpp's flag).
#include "commands.h"

namespace bonsai::cli {

void add_main_gpu_option(CLI::App* cmd, int& main_gpu) {
  cmd->add_option("--main-gpu", main_gpu,
                  "CUDA device of the cuda and auto paths, also -mg (numbered as CUDA_VISIBLE_DEVICES leaves "
                  "them; the CPU and ref paths ignore it)")
      ->capture_default_str();
}

}  // namespace bonsai::cli
