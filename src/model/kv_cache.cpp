// kv_cache.cpp: KV cache buffers and prefix copies.
#include "model/kv_cache.h"

#include "core/error.h"

namespace mgrl::model {

KvCache::KvCache(const io::ModelConfig& cfg, kernels::Ops& ops, int slots, int max_len)
    : ops_(ops), slots_(slots), max_len_(max_len) {
  MGRL_CHECK(slots > 0 && max_len > 0, "empty KV cache");
  row_bytes_ = static_cast<std::size_t>(cfg.kv_dim()) * ops.storage_size();
  const std::size_t layer_bytes = row_bytes_ * static_cast<std::size_t>(slots) * max_len;
  for (int l = 0; l < cfg.num_hidden_layers; ++l) {
    k_.push_back(ops_.alloc(layer_bytes));
    v_.push_back(ops_.alloc(layer_bytes));
  }
}

KvCache::~KvCache() {
  for (void* p : k_) ops_.release(p);
  for (void* p : v_) ops_.release(p);
}

void KvCache::copy_prefix(int dst, int src, int len) {
  if (dst == src || len <= 0) return;
  MGRL_CHECK(len <= max_len_ && dst < slots_ && src < slots_, "KV cache prefix copy out of range");
  const std::size_t slot_bytes = row_bytes_ * static_cast<std::size_t>(max_len_);
  for (std::size_t l = 0; l < k_.size(); ++l) {
    ops_.copy(static_cast<char*>(k_[l]) + dst * slot_bytes, static_cast<char*>(k_[l]) + src * slot_bytes,
              row_bytes_ * static_cast<std::size_t>(len));
    ops_.copy(static_cast<char*>(v_[l]) + dst * slot_bytes, static_cast<char*>(v_[l]) + src * slot_bytes,
              row_bytes_ * static_cast<std::size_t>(len));
  }
}

std::size_t KvCache::bytes() const { return 2 * k_.size() * row_bytes_ * static_cast<std::size_t>(slots_) * max_len_; }

}  // namespace mgrl::model
