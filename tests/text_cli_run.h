// Runs the built `bonsai` CLI (BONSAI_CLI) for the text-command tests:
// arguments through the shell, optional stdin text, captured stdout/stderr
// and exit code.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace bonsai::testing {

// A file path in the temp directory, removed when destroyed.
struct TempPath {
  std::string path;
  explicit TempPath(const std::string& tag) {
    static std::atomic<int> counter{0};
    path = (std::filesystem::temp_directory_path() /
            ("bonsai_text_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++)))
               .string();
  }
  ~TempPath() {
    std::error_code ec;
    std::filesystem::remove(path, ec);
  }
  TempPath(const TempPath&) = delete;
  TempPath& operator=(const TempPath&) = delete;
};

inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f << bytes;
}

// Single-quotes `s` for /bin/sh.
inline std::string shq(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

struct CliResult {
  int rc = -1;
  std::string out, err;
};

// `bonsai <args>` with `input` on stdin (empty: /dev/null).
inline CliResult run_bonsai(const std::string& args, const std::string& input = {}) {
  TempPath in("in"), out("out"), err("err");
  write_file(in.path, input);
  const std::string cmd =
      std::string(BONSAI_CLI) + " " + args + " <" + in.path + " >" + out.path + " 2>" + err.path;
  const int rc = std::system(cmd.c_str());
  CliResult r;
  r.rc = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  r.out = slurp(out.path);
  r.err = slurp(err.path);
  return r;
}

}  // namespace bonsai::testing
