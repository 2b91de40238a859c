// kv_cache.h: the paged key/value cache of inference. Per layer a k and a v pool of blocks
// [n_blocks, block_size, n_kv, head_dim] (storage dtype) and one block table: position p of sequence slot s is
// row p % block_size of block table[s][p / block_size]. Blocks are reference-counted, so G completions of one
// prompt share the blocks of its prefill and own only the blocks they write (the prompt's last, partly filled
// block is copied once per completion: block_size - 1 positions at most).
#pragma once
#include <cstdint>
#include <vector>

#include "io/hf_config.h"
#include "kernels/ops.h"

namespace mgrl::model {

class KvCache {
 public:
  // A cache whose slots each own max_len positions from the start (n_blocks = slots * ceil(max_len / block_size)).
  KvCache(const io::ModelConfig& cfg, kernels::Ops& ops, int slots, int max_len);
  // An empty pool of n_blocks blocks: slots get blocks with assign() / fork() and give them back with release().
  KvCache(const io::ModelConfig& cfg, kernels::Ops& ops, int slots, int max_len, int n_blocks, int block_size);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  int slots() const { return slots_; }
  int max_len() const { return max_len_; }  // positions a slot may use
  int block_size() const { return block_size_; }
  int n_blocks() const { return n_blocks_; }
  int free_blocks() const { return static_cast<int>(free_.size()); }
  static int blocks_for(int len, int block_size) { return (len + block_size - 1) / block_size; }
  void* k(int layer) { return k_[static_cast<std::size_t>(layer)]; }
  void* v(int layer) { return v_[static_cast<std::size_t>(layer)]; }

  // Fresh blocks for positions 0..len-1 of an empty slot (a UserError-free FatalError when the pool is short:
  // callers size the pool and check free_blocks()).
  void assign(int slot, int len);
  // An empty slot dst that continues sequence src after its first `prefix` positions, up to len positions: dst
  // shares src's full blocks of the prefix and gets fresh blocks for the rest, including a block for the prefix's
  // partly filled last block, whose rows copy_tail() copies once src has them.
  void fork(int dst, int src, int prefix, int len);
  // Copies the rows of the partly filled last block of the first `prefix` positions from src's block to dst's
  // (queued on the backend; nothing when prefix is a multiple of block_size).
  void copy_tail(int dst, int src, int prefix);
  // The slot gives its blocks back (a shared block returns to the pool with its last user).
  void release(int slot);
  // Whether position pos of slot has a block.
  bool has(int slot, int pos) const;

  // The table for the ops, uploaded first if it changed since the last call.
  const kernels::KvPages& pages();
  std::size_t bytes() const;  // the pools

 private:
  void allocate_pools(const io::ModelConfig& cfg);
  int take_block();
  kernels::Ops& ops_;
  int slots_, max_len_, max_blocks_, block_size_, n_blocks_;
  std::size_t row_bytes_ = 0;  // one position: n_kv * head_dim elements
  std::vector<void*> k_, v_;
  std::vector<std::int32_t> table_;  // host [slots, max_blocks], -1: none
  std::vector<int> refs_;            // per block
  std::vector<std::int32_t> free_;   // free blocks (a stack)
  std::int32_t* d_table_ = nullptr;
  bool dirty_ = true;
  kernels::KvPages pages_;
};

}  // namespace mgrl::model
