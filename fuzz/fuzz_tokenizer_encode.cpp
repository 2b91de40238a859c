// fuzz_tokenizer_encode.cpp: encoding arbitrary bytes (invalid UTF-8 included) with real tokenizers of the test
// data (byte-level BPE: Qwen2; SentencePiece-style: Llama 2) and decoding back (no round-trip claim: the
// tokenizers normalise).
#include <cstdlib>

#include "fuzz/fuzz_common.h"
#include "io/tokenizer.h"

#ifndef MGRL_FUZZ_DATA_DIR
#error "MGRL_FUZZ_DATA_DIR must name tests/data"
#endif

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using mgrl::io::Tokenizer;
  static const Tokenizer qwen = Tokenizer::from_file(MGRL_FUZZ_DATA_DIR "/tokenizers/qwen2_bytelevel/tokenizer.json");
  static const Tokenizer llama = Tokenizer::from_file(MGRL_FUZZ_DATA_DIR "/tokenizers/llama2_sentencepiece/tokenizer.json");
  const std::string text(reinterpret_cast<const char*>(data), size);
  mgrl::fuzz::refused_ok([&] {
    (void)qwen.decode(qwen.encode(text, false), false);
    (void)llama.decode(llama.encode(text, true), true);
  });
  return 0;
}
