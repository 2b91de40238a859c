// nf4.cpp: NF4 quantize/dequantize in bitsandbytes' layout and rounding, the double-quantized absmax (nf4.h).
#include "kernels/cpu/nf4.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

namespace mgrl::kernels::cpu {

namespace {

// The tables as fp32 bit patterns, so that they are exact. NF4: the QLoRA paper's normal-float values as
// bitsandbytes defines them; dynamic: bitsandbytes' create_dynamic_map(signed=True, 7 exponent bits, 8 bits).
// tests/unit/test_nf4.cpp checks both against the tables bitsandbytes wrote (tests/data/nf4/blocks.safetensors).
constexpr std::uint32_t kNf4Bits[16] = {
    0xbf800000u, 0xbf3239b1u, 0xbf066b30u, 0xbeca32a0u,
    0xbe91a24du, 0xbe3d353fu, 0xbdba7871u, 0x00000000u,
    0x3da2faffu, 0x3e24cae3u, 0x3e7c04ddu, 0x3ead033au,
    0x3ee1a4b8u, 0x3f1007abu, 0x3f3913b3u, 0x3f800000u};

constexpr std::uint32_t kDynamicBits[256] = {
    0xbf7e3333u, 0xbf7a999au, 0xbf770000u, 0xbf736666u, 0xbf6fcccdu, 0xbf6c3333u, 0xbf68999au, 0xbf650000u,
    0xbf616666u, 0xbf5dcccdu, 0xbf5a3333u, 0xbf56999au, 0xbf530000u, 0xbf4f6666u, 0xbf4bcccdu, 0xbf483333u,
    0xbf44999au, 0xbf410000u, 0xbf3d6666u, 0xbf39cccdu, 0xbf363334u, 0xbf32999au, 0xbf2f0000u, 0xbf2b6666u,
    0xbf27cccdu, 0xbf243334u, 0xbf20999au, 0xbf1d0000u, 0xbf196666u, 0xbf15cccdu, 0xbf123334u, 0xbf0e999au,
    0xbf0b0000u, 0xbf076666u, 0xbf03ccccu, 0xbf003333u, 0xbef93332u, 0xbef20000u, 0xbeeaccccu, 0xbee3999au,
    0xbedc6666u, 0xbed53333u, 0xbece0000u, 0xbec6ccccu, 0xbebf999au, 0xbeb86666u, 0xbeb13333u, 0xbeaa0000u,
    0xbea2ccccu, 0xbe9b999au, 0xbe946666u, 0xbe8d3334u, 0xbe860000u, 0xbe7d9999u, 0xbe6f3333u, 0xbe60cccdu,
    0xbe526666u, 0xbe440000u, 0xbe35999au, 0xbe273333u, 0xbe18cccdu, 0xbe0a6666u, 0xbdf80000u, 0xbddb3334u,
    0xbdc9eb85u, 0xbdc428f7u, 0xbdbe6667u, 0xbdb8a3d7u, 0xbdb2e148u, 0xbdad1eb8u, 0xbda75c2au, 0xbda1999au,
    0xbd9bd70au, 0xbd96147bu, 0xbd9051ebu, 0xbd8a8f5du, 0xbd84cccdu, 0xbd7e147bu, 0xbd728f5du, 0xbd670a3du,
    0xbd5b851fu, 0xbd500000u, 0xbd447ae1u, 0xbd38f5c3u, 0xbd2d70a3u, 0xbd21eb85u, 0xbd166667u, 0xbd0ae148u,
    0xbcfeb852u, 0xbce7ae15u, 0xbcd0a3d7u, 0xbcb9999au, 0xbca28f5du, 0xbc8b851fu, 0xbc68f5c3u, 0xbc3ae148u,
    0xbc1f3b64u, 0xbc160418u, 0xbc0ccccdu, 0xbc039581u, 0xbbf4bc6au, 0xbbe24dd3u, 0xbbcfdf3bu, 0xbbbd70a4u,
    0xbbab020du, 0xbb989374u, 0xbb8624ddu, 0xbb676c8au, 0xbb428f5cu, 0xbb1db22du, 0xbaf1a9fcu, 0xbaa7ef9du,
    0xba7765ffu, 0xba59e83eu, 0xba3c6a80u, 0xba1eecc1u, 0xba016f01u, 0xb9c7e283u, 0xb98ce705u, 0xb923d70bu,
    0xb8ba1f4bu, 0xb88aefb3u, 0xb8378034u, 0xb7b24206u, 0xb70205ffu, 0xb65a1a94u, 0xb513a3b7u, 0x00000000u,
    0x3513a3b7u, 0x365a1a94u, 0x370205ffu, 0x37b24206u, 0x38378034u, 0x388aefb3u, 0x38ba1f4bu, 0x3923d70bu,
    0x398ce705u, 0x39c7e283u, 0x3a016f01u, 0x3a1eecc1u, 0x3a3c6a80u, 0x3a59e83eu, 0x3a7765ffu, 0x3aa7ef9du,
    0x3af1a9fcu, 0x3b1db22du, 0x3b428f5cu, 0x3b676c8au, 0x3b8624ddu, 0x3b989374u, 0x3bab020du, 0x3bbd70a4u,
    0x3bcfdf3bu, 0x3be24dd3u, 0x3bf4bc6au, 0x3c039581u, 0x3c0ccccdu, 0x3c160418u, 0x3c1f3b64u, 0x3c3ae148u,
    0x3c68f5c3u, 0x3c8b851fu, 0x3ca28f5du, 0x3cb9999au, 0x3cd0a3d7u, 0x3ce7ae15u, 0x3cfeb852u, 0x3d0ae148u,
    0x3d166667u, 0x3d21eb85u, 0x3d2d70a3u, 0x3d38f5c3u, 0x3d447ae1u, 0x3d500000u, 0x3d5b851fu, 0x3d670a3du,
    0x3d728f5du, 0x3d7e147bu, 0x3d84cccdu, 0x3d8a8f5du, 0x3d9051ebu, 0x3d96147bu, 0x3d9bd70au, 0x3da1999au,
    0x3da75c2au, 0x3dad1eb8u, 0x3db2e148u, 0x3db8a3d7u, 0x3dbe6667u, 0x3dc428f7u, 0x3dc9eb85u, 0x3ddb3334u,
    0x3df80000u, 0x3e0a6666u, 0x3e18cccdu, 0x3e273333u, 0x3e35999au, 0x3e440000u, 0x3e526666u, 0x3e60cccdu,
    0x3e6f3333u, 0x3e7d9999u, 0x3e860000u, 0x3e8d3334u, 0x3e946666u, 0x3e9b999au, 0x3ea2ccccu, 0x3eaa0000u,
    0x3eb13333u, 0x3eb86666u, 0x3ebf999au, 0x3ec6ccccu, 0x3ece0000u, 0x3ed53333u, 0x3edc6666u, 0x3ee3999au,
    0x3eeaccccu, 0x3ef20000u, 0x3ef93332u, 0x3f003333u, 0x3f03ccccu, 0x3f076666u, 0x3f0b0000u, 0x3f0e999au,
    0x3f123334u, 0x3f15cccdu, 0x3f196666u, 0x3f1d0000u, 0x3f20999au, 0x3f243334u, 0x3f27cccdu, 0x3f2b6666u,
    0x3f2f0000u, 0x3f32999au, 0x3f363334u, 0x3f39cccdu, 0x3f3d6666u, 0x3f410000u, 0x3f44999au, 0x3f483333u,
    0x3f4bcccdu, 0x3f4f6666u, 0x3f530000u, 0x3f56999au, 0x3f5a3333u, 0x3f5dcccdu, 0x3f616666u, 0x3f650000u,
    0x3f68999au, 0x3f6c3333u, 0x3f6fcccdu, 0x3f736666u, 0x3f770000u, 0x3f7a999au, 0x3f7e3333u, 0x3f800000u,
};

struct Tables {
  float nf4[16];
  float nf4_mid[15];  // fp32 midpoints (c[i] + c[i+1]) / 2
  float dynamic[256];
  Tables() {
    for (int i = 0; i < 16; ++i) std::memcpy(&nf4[i], &kNf4Bits[i], 4);
    for (int i = 0; i < 15; ++i) nf4_mid[i] = (nf4[i] + nf4[i + 1]) / 2.0f;
    for (int i = 0; i < 256; ++i) std::memcpy(&dynamic[i], &kDynamicBits[i], 4);
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

// The number of midpoints strictly below v: the code whose interval (mid[i-1], mid[i]] holds v.
inline std::uint8_t nf4_index(float v, const float* mid) {
  int lo = 0;
  int hi = 15;  // answer in [0, 15]
  while (lo < hi) {
    const int m = (lo + hi) / 2;
    if (mid[m] < v) lo = m + 1;
    else hi = m;
  }
  return static_cast<std::uint8_t>(lo);
}

// bitsandbytes' CPU 8-bit quantizer is a lookup table, not an exact nearest search: [-1, 1] is cut into 65536
// points v_i = -1 + 2i / 65535 (fp32), lut[i] = the number of code midpoints 0.5 * (c[j] + c[j+1]) below v_i, and a
// scaled value s maps to lut[(uint16)((s + 1) * 0.5 * 65535 + 0.5)]. Near a midpoint this can pick the farther code;
// doing the same keeps the bytes equal.
constexpr int kLut = 65536;

struct DynamicLut {
  std::uint8_t lut[kLut];
  explicit DynamicLut(const float* c) {
    float mid[255];
    for (int j = 0; j < 255; ++j) mid[j] = 0.5f * (c[j] + c[j + 1]);
    int j = 0;
    for (int i = 0; i < kLut; ++i) {
      const float v = -1.0f + (2.0f * static_cast<float>(i)) / static_cast<float>(kLut - 1);
      while (j < 255 && mid[j] < v) ++j;
      lut[i] = static_cast<std::uint8_t>(j);
    }
  }
  std::uint8_t operator()(float s) const {
    s = std::min(1.0f, std::max(-1.0f, s));
    const float t = (s + 1.0f) * 0.5f;
    const float u = t * static_cast<float>(kLut - 1);
    return lut[static_cast<std::uint16_t>(u + 0.5f)];
  }
};

inline float clamp1(float v) { return std::min(1.0f, std::max(-1.0f, v)); }

}  // namespace

const float* nf4_code() { return tables().nf4; }
const float* dynamic_code() { return tables().dynamic; }

std::int64_t nf4_bytes(std::int64_t rows, std::int64_t cols, bool double_quant) {
  const std::int64_t n = rows * cols;
  const std::int64_t blocks = nf4_blocks(n);
  if (!double_quant) return nf4_code_bytes(n) + 4 * blocks;
  return nf4_code_bytes(n) + blocks + 4 * nf4_nested_blocks(n) + 4;
}

void nf4_quantize(const float* x, std::int64_t n, std::uint8_t* codes, float* absmax) {
  const Tables& t = tables();
  const std::int64_t blocks = nf4_blocks(n);
  std::memset(codes, 0, static_cast<std::size_t>(nf4_code_bytes(n)));
  for (std::int64_t b = 0; b < blocks; ++b) {
    const std::int64_t i0 = b * kNf4Block;
    const std::int64_t i1 = std::min(n, i0 + kNf4Block);
    float am = 0.0f;
    for (std::int64_t i = i0; i < i1; ++i) am = std::max(am, std::fabs(x[i]));
    const bool tail = (i1 - i0) < kNf4Block;
    const float am_c = std::max(am, 1e-38f);
    const float r = 1.0f / am_c;
    absmax[b] = tail ? am_c : am;
    for (std::int64_t i = i0; i < i1; ++i) {
      const float s = clamp1(tail ? x[i] / am_c : x[i] * r);
      const std::uint8_t q = nf4_index(s, t.nf4_mid);
      codes[i / 2] |= (i % 2 == 0) ? static_cast<std::uint8_t>(q << 4) : q;
    }
  }
  if (n % 2 == 1) codes[n / 2] |= 7;  // the padding nibble: 0.0
}

namespace {
const DynamicLut& dynamic_lut() {
  static const DynamicLut l(tables().dynamic);
  return l;
}
}  // namespace

void nf4_quantize_parallel(const float* x, std::int64_t n, std::uint8_t* codes, float* absmax, int threads) {
  const std::int64_t blocks = nf4_blocks(n);
  const std::int64_t per = std::max<std::int64_t>(1024, (blocks + threads - 1) / std::max(threads, 1));  // blocks
  if (threads <= 1 || blocks <= per) {
    nf4_quantize(x, n, codes, absmax);
    return;
  }
  std::vector<std::thread> pool;
  for (std::int64_t b0 = 0; b0 < blocks; b0 += per) {
    const std::int64_t i0 = b0 * kNf4Block, i1 = std::min(n, (b0 + per) * kNf4Block);
    // chunks start on a block (64 values = 32 code bytes): only the last one has the tail block or a padding nibble
    pool.emplace_back([=] { nf4_quantize(x + i0, i1 - i0, codes + i0 / 2, absmax + b0); });
  }
  for (auto& t : pool) t.join();
}

void nf4_double_quantize(const float* absmax, std::int64_t nblocks, std::uint8_t* qabsmax, float* nested_absmax,
                         float* offset, bool offset_given) {
  const DynamicLut& lut = dynamic_lut();
  if (!offset_given) {
    double sum = 0.0;
    for (std::int64_t b = 0; b < nblocks; ++b) sum += absmax[b];
    *offset = static_cast<float>(sum / static_cast<double>(nblocks));
  }
  const float off = *offset;
  const std::int64_t groups = (nblocks + kNf4NestedBlock - 1) / kNf4NestedBlock;
  for (std::int64_t g = 0; g < groups; ++g) {
    const std::int64_t i0 = g * kNf4NestedBlock;
    const std::int64_t i1 = std::min(nblocks, i0 + kNf4NestedBlock);
    float am = 0.0f;
    for (std::int64_t i = i0; i < i1; ++i) am = std::max(am, std::fabs(absmax[i] - off));
    nested_absmax[g] = am;
    if (am == 0.0f) {  // every absmax equals the offset
      std::fill(qabsmax + i0, qabsmax + i1, std::uint8_t{0});
      continue;
    }
    const float r = 1.0f / am;
    for (std::int64_t i = i0; i < i1; ++i) qabsmax[i] = lut((absmax[i] - off) * r);
  }
}

void nf4_absmax_dequantize(const std::uint8_t* qabsmax, const float* nested_absmax, float offset,
                           const float* nested_code, std::int64_t nblocks, float* absmax) {
  for (std::int64_t b = 0; b < nblocks; ++b)
    absmax[b] = nested_code[qabsmax[b]] * nested_absmax[b / kNf4NestedBlock] + offset;
}

void nf4_dequantize_range(const std::uint8_t* codes, const float* absmax, const float* code, std::int64_t begin,
                          std::int64_t end, float* out) {
  for (std::int64_t i = begin; i < end; ++i) {
    const std::uint8_t byte = codes[i / 2];
    const std::uint8_t q = (i % 2 == 0) ? static_cast<std::uint8_t>(byte >> 4) : static_cast<std::uint8_t>(byte & 15);
    out[i - begin] = code[q] * absmax[i / kNf4Block];
  }
}

void nf4_dequantize(const std::uint8_t* codes, const float* absmax, const float* code, std::int64_t n, float* out) {
  nf4_dequantize_range(codes, absmax, code, 0, n, out);
}

}  // namespace mgrl::kernels::cpu
