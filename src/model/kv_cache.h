// kv_cache.h: the key/value cache of inference: per layer, keys and values of up to `slots`
// sequences of up to `max_len` positions ([slots, max_len, n_kv, head_dim], storage dtype).
#pragma once
#include <vector>

#include "io/hf_config.h"
#include "kernels/ops.h"

namespace mgrl::model {

class KvCache {
 public:
  KvCache(const io::ModelConfig& cfg, kernels::Ops& ops, int slots, int max_len);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  int slots() const { return slots_; }
  int max_len() const { return max_len_; }
  void* k(int layer) { return k_[static_cast<std::size_t>(layer)]; }
  void* v(int layer) { return v_[static_cast<std::size_t>(layer)]; }
  // Copies positions 0..len-1 of slot src into slot dst in every layer (a shared prompt prefill).
  void copy_prefix(int dst, int src, int len);
  std::size_t bytes() const;

 private:
  kernels::Ops& ops_;
  int slots_, max_len_;
  std::size_t row_bytes_;  // one position of one slot: n_kv * head_dim elements
  std::vector<void*> k_, v_;
};

}  // namespace mgrl::model
