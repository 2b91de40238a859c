// build_info.h: facts fixed at configure time (version, git commit, build options).
#pragma once

namespace mgrl {

struct BuildInfo {
  const char* version;
  const char* git_sha;
  const char* build_type;
  const char* compiler;
  const char* cuda_architectures;  // "" when built without CUDA
  const char* source_dir;
  bool with_cuda;
};

const BuildInfo& build_info();

}  // namespace mgrl
