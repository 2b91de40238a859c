// fuzz_tokenizer_json.cpp: loading tokenizer.json (model types, vocabularies, merges, pre-tokenizer and
// normalizer settings, added tokens), then encoding and decoding a fixed text with what was loaded.
#include "fuzz/fuzz_common.h"
#include "io/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = mgrl::fuzz::write_input("tokenizer.json", data, size);
  mgrl::fuzz::refused_ok([&] {
    const auto tok = mgrl::io::Tokenizer::from_file(path);
    const auto ids = tok.encode("Hello, world! 12+34= \xc3\xa9t\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd <|im_end|>\n\t  x");
    (void)tok.decode(ids, false);
  });
  return 0;
}
