// kv_cache.cpp: the paged KV cache: pools, block table, reference-counted blocks.
#include "model/kv_cache.h"

#include <string>

#include "core/error.h"

namespace mgrl::model {

void KvCache::allocate_pools(const io::ModelConfig& cfg) {
  MGRL_CHECK(slots_ > 0 && max_len_ > 0 && block_size_ > 0 && n_blocks_ > 0, "empty KV cache");
  max_blocks_ = blocks_for(max_len_, block_size_);
  row_bytes_ = static_cast<std::size_t>(cfg.kv_dim()) * ops_.storage_size();
  const std::size_t pool_bytes = row_bytes_ * static_cast<std::size_t>(n_blocks_) * block_size_;
  for (int l = 0; l < cfg.num_hidden_layers; ++l) {
    k_.push_back(ops_.alloc(pool_bytes));
    v_.push_back(ops_.alloc(pool_bytes));
  }
  table_.assign(static_cast<std::size_t>(slots_) * max_blocks_, -1);
  refs_.assign(static_cast<std::size_t>(n_blocks_), 0);
  for (int b = n_blocks_ - 1; b >= 0; --b) free_.push_back(b);
  d_table_ = static_cast<std::int32_t*>(ops_.alloc(table_.size() * sizeof(std::int32_t)));
  pages_ = {d_table_, slots_, max_blocks_, block_size_, n_blocks_};
}

KvCache::KvCache(const io::ModelConfig& cfg, kernels::Ops& ops, int slots, int max_len)
    : ops_(ops), slots_(slots), max_len_(max_len), max_blocks_(0), block_size_(max_len), n_blocks_(slots) {
  allocate_pools(cfg);
  for (int s = 0; s < slots_; ++s) assign(s, max_len_);
}

KvCache::KvCache(const io::ModelConfig& cfg, kernels::Ops& ops, int slots, int max_len, int n_blocks,
                 int block_size)
    : ops_(ops), slots_(slots), max_len_(max_len), max_blocks_(0), block_size_(block_size), n_blocks_(n_blocks) {
  allocate_pools(cfg);
}

KvCache::~KvCache() {
  for (void* p : k_) ops_.release(p);
  for (void* p : v_) ops_.release(p);
  ops_.release(d_table_);
}

int KvCache::take_block() {
  MGRL_CHECK(!free_.empty(), "KV cache: no free block (the pool holds " + std::to_string(n_blocks_) + ")");
  const int b = free_.back();
  free_.pop_back();
  refs_[static_cast<std::size_t>(b)] = 1;
  return b;
}

void KvCache::assign(int slot, int len) { fork(slot, -1, 0, len); }

void KvCache::fork(int dst, int src, int prefix, int len) {
  MGRL_CHECK(dst >= 0 && dst < slots_ && len >= 0 && len <= max_len_ && prefix >= 0 && prefix <= len,
             "KV cache: slot or length out of range");
  MGRL_CHECK(src < slots_ && (src >= 0 || prefix == 0) && src != dst, "KV cache: bad fork source");
  std::int32_t* row = &table_[static_cast<std::size_t>(dst) * max_blocks_];
  for (int j = 0; j < max_blocks_; ++j) MGRL_CHECK(row[j] < 0, "KV cache: slot " + std::to_string(dst) + " is in use");
  const int shared = prefix / block_size_;  // full blocks of the prefix
  const int need = blocks_for(len, block_size_);
  MGRL_CHECK(need - shared <= free_blocks(), "KV cache: no free block (the pool holds " + std::to_string(n_blocks_) + ")");
  for (int j = 0; j < shared; ++j) {
    const std::int32_t b = table_[static_cast<std::size_t>(src) * max_blocks_ + j];
    MGRL_CHECK(b >= 0, "KV cache: fork of a prefix with no block");
    row[j] = b;
    ++refs_[static_cast<std::size_t>(b)];
  }
  for (int j = shared; j < need; ++j) row[j] = take_block();
  dirty_ = true;
}

void KvCache::copy_tail(int dst, int src, int prefix) {
  const int rows = prefix % block_size_;
  if (rows == 0) return;
  const int j = prefix / block_size_;
  const std::int32_t from = table_[static_cast<std::size_t>(src) * max_blocks_ + j];
  const std::int32_t to = table_[static_cast<std::size_t>(dst) * max_blocks_ + j];
  MGRL_CHECK(from >= 0 && to >= 0 && from != to, "KV cache: bad tail copy");
  const std::size_t block_bytes = row_bytes_ * static_cast<std::size_t>(block_size_);
  for (std::size_t l = 0; l < k_.size(); ++l) {
    ops_.copy(static_cast<char*>(k_[l]) + to * block_bytes, static_cast<char*>(k_[l]) + from * block_bytes,
              row_bytes_ * static_cast<std::size_t>(rows));
    ops_.copy(static_cast<char*>(v_[l]) + to * block_bytes, static_cast<char*>(v_[l]) + from * block_bytes,
              row_bytes_ * static_cast<std::size_t>(rows));
  }
}

void KvCache::release(int slot) {
  MGRL_CHECK(slot >= 0 && slot < slots_, "KV cache: slot out of range");
  std::int32_t* row = &table_[static_cast<std::size_t>(slot) * max_blocks_];
  for (int j = 0; j < max_blocks_; ++j) {
    if (row[j] < 0) continue;
    if (--refs_[static_cast<std::size_t>(row[j])] == 0) free_.push_back(row[j]);
    row[j] = -1;
  }
  dirty_ = true;
}

bool KvCache::has(int slot, int pos) const {
  return slot >= 0 && slot < slots_ && pos >= 0 && pos < max_len_ &&
         table_[static_cast<std::size_t>(slot) * max_blocks_ + pos / block_size_] >= 0;
}

const kernels::KvPages& KvCache::pages() {
  if (dirty_) {
    ops_.upload(d_table_, table_.data(), table_.size() * sizeof(std::int32_t));
    dirty_ = false;
  }
  return pages_;
}

std::size_t KvCache::bytes() const {
  return 2 * k_.size() * row_bytes_ * static_cast<std::size_t>(n_blocks_) * block_size_;
}

}  // namespace mgrl::model
