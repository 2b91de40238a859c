// test_comm.cpp: Comm (allreduce sum/avg, broadcast, allgather, barrier) on the backend given by
// --backend=cpu|cuda, at whatever rank count mpiexec started. CUDA runs skip without a GPU per rank.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "dist/comm.h"
#include "dist/device.h"
#include "tests/mpi/mpi_gtest_main.h"

#if MGRL_WITH_CUDA
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#endif

namespace mgrl {
namespace {

using dist::Backend;

// The device and communicator of this test binary, made once.
struct Setup {
  bool usable = false;
  std::string why;
  dist::Device device;
  std::unique_ptr<dist::Comm> comm;
};

Setup& setup() {
  static Setup s = [] {
    Setup r;
    const std::string backend = test::arg("backend").empty() ? "cpu" : test::arg("backend");
    try {
      r.device = dist::choose_device(test::env(), backend, 1);
      // --comm=self: the one-rank communicator made directly (on the CPU make_comm gives MPI at any size).
      r.comm = test::arg("comm") == "self" ? dist::make_self_comm(r.device)
                                           : dist::make_comm(test::env(), r.device, 60.0);
      r.usable = true;
    } catch (const UserError& e) {
      r.why = e.what();  // e.g. no GPU per rank: the same on every rank
    }
    return r;
  }();
  // The communicator refers to the MPI environment of main(): release it before main returns.
  static const bool released_at_exit = (test::before_exit([] { s.comm.reset(); }), true);
  (void)released_at_exit;
  return s;
}

// A buffer in the memory the communicator works on (host for MPI, device for NCCL).
class Buffer {
 public:
  explicit Buffer(std::size_t bytes) : bytes_(bytes) {
    if (cuda()) {
#if MGRL_WITH_CUDA
      if (cudaMalloc(&ptr_, bytes ? bytes : 1) != cudaSuccess) throw FatalError("cudaMalloc");
#endif
    } else {
      host_.resize(bytes ? bytes : 1);
      ptr_ = host_.data();
    }
  }
  ~Buffer() {
#if MGRL_WITH_CUDA
    if (cuda()) cudaFree(ptr_);
#endif
  }
  void* get() { return ptr_; }
  template <typename T>
  void put(const std::vector<T>& v) {
    copy(ptr_, v.data(), v.size() * sizeof(T), true);
  }
  template <typename T>
  std::vector<T> take(std::size_t n) {
    std::vector<T> v(n);
    setup().comm->synchronize();
    copy(v.data(), ptr_, n * sizeof(T), false);
    return v;
  }

 private:
  static bool cuda() { return setup().device.backend == Backend::Cuda; }
  static void copy(void* dst, const void* src, std::size_t n, bool to_buffer) {
    if (n == 0) return;
#if MGRL_WITH_CUDA
    if (cuda()) {
      if (cudaMemcpy(dst, src, n, to_buffer ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost) != cudaSuccess)
        throw FatalError("cudaMemcpy");
      return;
    }
#endif
    (void)to_buffer;
    std::memcpy(dst, src, n);
  }
  std::size_t bytes_;
  std::vector<char> host_;
  void* ptr_ = nullptr;
};

class CommTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!setup().usable) GTEST_SKIP() << setup().why;
  }
  dist::Comm& comm() { return *setup().comm; }
  int n() { return comm().size(); }
  int r() { return comm().rank(); }
};

const std::vector<std::size_t> kSizes{0, 1, 7, 1000, (1u << 18) + 3};

// SLURM's GPU binding: every GPU of the node visible (srun --gpus-per-node, mpirun): rank i takes GPU i; one GPU
// per task (--gpus-per-task=1, --gpu-bind=single:1): each takes the one it sees; none: -1. Shared GPUs (more ranks
// than GPUs) are found by choose_device, which refuses them.
TEST(GpuBinding, FollowsWhatTheLauncherShows) {
  using mgrl::dist::gpu_index_for;
  for (int r = 0; r < 4; ++r) EXPECT_EQ(gpu_index_for(r, 4, 4), r);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(gpu_index_for(r, 4, 8), r);  // a node with more GPUs than ranks
  for (int r = 0; r < 4; ++r) EXPECT_EQ(gpu_index_for(r, 4, 1), 0);  // --gpus-per-task=1
  EXPECT_EQ(gpu_index_for(3, 4, 2), 1);                                // 2 visible to 4 ranks: pairs (refused later)
  EXPECT_EQ(gpu_index_for(0, 1, 0), -1);
  EXPECT_EQ(gpu_index_for(2, 4, 0), -1);
}

TEST_F(CommTest, RankAndSizeMatchMpi) {
  EXPECT_EQ(comm().rank(), test::env().rank());
  EXPECT_EQ(comm().size(), test::env().size());
  EXPECT_EQ(comm().backend(), setup().device.backend);
}

template <typename T>
void check_sum(CommTest* t, dist::Comm& c, DType dt, T scale) {
  const int n = c.size(), r = c.rank();
  for (const std::size_t count : kSizes) {
    std::vector<T> v(count);
    for (std::size_t i = 0; i < count; ++i) v[i] = static_cast<T>((r + 1) * static_cast<T>(i % 13)) * scale;
    Buffer b(count * sizeof(T));
    b.put(v);
    c.allreduce_sum(b.get(), count, dt);
    const auto out = b.take<T>(count);
    const T ranks_sum = static_cast<T>(n * (n + 1) / 2);
    for (std::size_t i = 0; i < count; ++i)
      ASSERT_EQ(out[i], static_cast<T>(ranks_sum * static_cast<T>(i % 13)) * scale)
          << "element " << i << " of " << count << " (" << dtype_name(dt) << ")";
  }
  (void)t;
}

TEST_F(CommTest, AllreduceSumF32) { check_sum<float>(this, comm(), DType::F32, 1.0f); }
TEST_F(CommTest, AllreduceSumF64) { check_sum<double>(this, comm(), DType::F64, 0.5); }
TEST_F(CommTest, AllreduceSumI32) { check_sum<std::int32_t>(this, comm(), DType::I32, -3); }
// Values above 2^32 catch a reduction done in 32 bits.
TEST_F(CommTest, AllreduceSumI64) { check_sum<std::int64_t>(this, comm(), DType::I64, std::int64_t{1} << 35); }

TEST_F(CommTest, AllreduceAvgF32AndF64) {
  const std::size_t count = 4099;
  std::vector<float> v(count);
  std::vector<double> w(count);
  for (std::size_t i = 0; i < count; ++i) {
    v[i] = static_cast<float>(r()) * 2.0f + static_cast<float>(i % 5);
    w[i] = static_cast<double>(r()) * 4.0 - static_cast<double>(i % 3);
  }
  Buffer bv(count * sizeof(float)), bw(count * sizeof(double));
  bv.put(v);
  bw.put(w);
  comm().allreduce_avg(bv.get(), count, DType::F32);
  comm().allreduce_avg(bw.get(), count, DType::F64);
  const auto ov = bv.take<float>(count);
  const auto ow = bw.take<double>(count);
  const double mean_rank = (n() - 1) / 2.0;
  for (std::size_t i = 0; i < count; ++i) {
    ASSERT_FLOAT_EQ(ov[i], static_cast<float>(mean_rank * 2.0 + static_cast<double>(i % 5))) << i;
    ASSERT_DOUBLE_EQ(ow[i], mean_rank * 4.0 - static_cast<double>(i % 3)) << i;
  }
}

TEST_F(CommTest, AllreduceAvgRejectsIntegers) {
  Buffer b(16);
  EXPECT_THROW(comm().allreduce_avg(b.get(), 4, DType::I32), FatalError);
}

TEST_F(CommTest, HalfPrecisionOnlyOnCuda) {
  const std::size_t count = 513;
  Buffer b(count * 2);
  if (setup().device.backend == Backend::Cpu) {
    EXPECT_THROW(comm().allreduce_sum(b.get(), count, DType::BF16), FatalError);
    EXPECT_THROW(comm().allreduce_avg(b.get(), count, DType::F16), FatalError);
    return;
  }
#if MGRL_WITH_CUDA
  // Small integers are exact in both formats: sum and average must be exact too.
  std::vector<__nv_bfloat16> vb(count);
  std::vector<__half> vh(count);
  for (std::size_t i = 0; i < count; ++i) {
    vb[i] = __float2bfloat16(static_cast<float>((r() + 1) * static_cast<int>(i % 4)));
    vh[i] = __float2half(static_cast<float>(2 * r() + static_cast<int>(i % 3)));
  }
  Buffer bh(count * 2);
  b.put(vb);
  bh.put(vh);
  comm().allreduce_sum(b.get(), count, DType::BF16);
  comm().allreduce_avg(bh.get(), count, DType::F16);
  const auto ob = b.take<__nv_bfloat16>(count);
  const auto oh = bh.take<__half>(count);
  const float ranks_sum = static_cast<float>(n() * (n() + 1) / 2);
  for (std::size_t i = 0; i < count; ++i) {
    ASSERT_EQ(__bfloat162float(ob[i]), ranks_sum * static_cast<float>(i % 4)) << i;
    ASSERT_EQ(__half2float(oh[i]), static_cast<float>(n() - 1 + static_cast<int>(i % 3))) << i;
  }
#endif
}

TEST_F(CommTest, BroadcastFromEveryRoot) {
  for (int root = 0; root < n(); ++root) {
    for (const std::size_t bytes : {std::size_t{0}, std::size_t{1}, std::size_t{12345}}) {
      std::vector<unsigned char> v(bytes);
      for (std::size_t i = 0; i < bytes; ++i) v[i] = static_cast<unsigned char>((r() * 31 + i) & 0xff);
      Buffer b(bytes);
      b.put(v);
      comm().broadcast(b.get(), bytes, root);
      const auto out = b.take<unsigned char>(bytes);
      for (std::size_t i = 0; i < bytes; ++i)
        ASSERT_EQ(out[i], static_cast<unsigned char>((root * 31 + i) & 0xff)) << "root " << root << " byte " << i;
    }
  }
}

TEST_F(CommTest, AllgatherInRankOrder) {
  const std::size_t per = 5;
  std::vector<std::int32_t> mine(per);
  for (std::size_t j = 0; j < per; ++j) mine[j] = r() * 100 + static_cast<int>(j);
  Buffer send(per * 4), recv(per * 4 * static_cast<std::size_t>(n()));
  send.put(mine);
  comm().allgather(send.get(), recv.get(), per * 4);
  const auto all = recv.take<std::int32_t>(per * static_cast<std::size_t>(n()));
  for (int q = 0; q < n(); ++q)
    for (std::size_t j = 0; j < per; ++j) ASSERT_EQ(all[q * per + j], q * 100 + static_cast<int>(j));
}

TEST_F(CommTest, BarrierWaitsForTheSlowestRank) {
  using clock = std::chrono::steady_clock;  // CLOCK_MONOTONIC: comparable across processes of one host
  if (test::env().num_nodes() > 1) GTEST_SKIP() << "clocks of different hosts are not comparable";
  std::this_thread::sleep_for(std::chrono::milliseconds(40 * r()));
  const double before = std::chrono::duration<double>(clock::now().time_since_epoch()).count();
  comm().barrier();
  const double after = std::chrono::duration<double>(clock::now().time_since_epoch()).count();
  Buffer send(16), recv(16 * static_cast<std::size_t>(n()));
  send.put(std::vector<double>{before, after});
  comm().allgather(send.get(), recv.get(), 16);
  const auto t = recv.take<double>(2 * static_cast<std::size_t>(n()));
  double latest_arrival = 0;
  for (int q = 0; q < n(); ++q) latest_arrival = std::max(latest_arrival, t[2 * q]);
  for (int q = 0; q < n(); ++q) EXPECT_GE(t[2 * q + 1], latest_arrival) << "rank " << q << " left the barrier early";
}

// Buckets reduced asynchronously (as the backward pass does per layer), then one wait: every bucket is summed.
TEST_F(CommTest, AsyncBucketsThenWait) {
  const std::size_t count = 3001, buckets = 5;
  std::vector<float> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = static_cast<float>((r() + 1) * static_cast<int>(i % 11));
  Buffer b(count * sizeof(float));
  b.put(v);
  for (std::size_t k = 0; k < buckets; ++k) {
    const std::size_t lo = count * k / buckets, hi = count * (k + 1) / buckets;
    comm().allreduce_sum_async(static_cast<float*>(b.get()) + lo, hi - lo, DType::F32);
  }
  comm().wait();
  const auto out = b.take<float>(count);
  const float ranks_sum = static_cast<float>(n() * (n() + 1) / 2);
  for (std::size_t i = 0; i < count; ++i) ASSERT_EQ(out[i], ranks_sum * static_cast<float>(i % 11)) << i;
}

TEST_F(CommTest, SelfTestPasses) { EXPECT_GE(dist::comm_selftest(comm()), 0.0); }

// Which communicator make_comm gives: MPI on the CPU; on GPUs NCCL, or with MGRL_SELF_COMM=1 (opt-in) in a job of
// one rank none at all (no NCCL start-up for a single-GPU run).
TEST_F(CommTest, OneRankOnAGpuStartsNoNccl) {
  if (test::arg("comm") == "self") GTEST_SKIP() << "--comm=self: made directly, not chosen by make_comm";
  const char* sw = std::getenv("MGRL_SELF_COMM");
  const bool self_on = sw && std::string(sw) == "1";
  if (setup().device.backend == Backend::Cpu) EXPECT_EQ(comm().name(), "mpi");
  else EXPECT_EQ(comm().name(), n() == 1 && self_on ? "self" : "nccl");
}

// The one-rank communicator's own promises: an allgather into another buffer is a copy, one in place leaves the
// buffer, a broadcast names rank 0 only.
TEST_F(CommTest, SelfCommCopiesAndRefusesOtherRoots) {
  if (n() != 1) GTEST_SKIP() << "the self communicator is for jobs of one rank";
  auto self = dist::make_self_comm(setup().device);
  EXPECT_EQ(self->size(), 1);
  EXPECT_EQ(self->rank(), 0);
  std::vector<std::int32_t> v(1000);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::int32_t>(i * 7 - 300);
  Buffer a(v.size() * 4), b(v.size() * 4);
  a.put(v);
  b.put(std::vector<std::int32_t>(v.size(), 0));
  self->allgather_async(a.get(), b.get(), v.size() * 4);
  self->wait();
  self->synchronize();
  EXPECT_EQ(b.take<std::int32_t>(v.size()), v);
  self->allgather(a.get(), a.get(), v.size() * 4);  // in place
  self->allreduce_sum(a.get(), v.size(), DType::I32);
  self->allreduce_avg(a.get(), v.size() / 2, DType::F32);  // the bytes of 500 floats, unchanged
  self->broadcast(a.get(), v.size() * 4, 0);
  self->barrier();
  EXPECT_EQ(a.take<std::int32_t>(v.size()), v);
  EXPECT_THROW(self->broadcast(a.get(), 4, 1), FatalError);
  EXPECT_THROW(self->allreduce_avg(a.get(), 4, DType::I64), FatalError);
}

}  // namespace
}  // namespace mgrl
