// fuzz_jsonl.cpp: the JSONL data readers of every mode: SFT examples (prompt/completion or chat messages) and
// GRPO prompts (prompt or messages, any other columns), tokenized with a small real tokenizer.
#include "fuzz/fuzz_common.h"
#include "io/chat_template.h"
#include "io/tokenizer.h"
#include "rl/prompts.h"
#include "train/data.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using mgrl::io::Tokenizer;
  static const Tokenizer tok = Tokenizer::from_file(MGRL_FUZZ_DATA_DIR "/tokenizers/qwen2_bytelevel/tokenizer.json");
  static const mgrl::io::ChatTemplate chatml(tok, [] {
    mgrl::io::ChatOptions c;
    c.format = "chatml";
    return c;
  }());
  static const mgrl::io::ChatTemplate own(tok, mgrl::io::ChatOptions{});  // the tokenizer's Jinja template
  const std::string path = mgrl::fuzz::write_input("data.jsonl", data, size);
  mgrl::fuzz::refused_ok([&] {
    mgrl::train::DataOptions o;
    o.max_seq_len = 64;
    (void)mgrl::train::load_examples(path, tok, o);
  });
  for (const auto* chat : {&chatml, &own}) {
    mgrl::fuzz::refused_ok([&] {
      mgrl::train::DataOptions o;
      o.chat = chat;
      (void)mgrl::train::load_examples(path, tok, o);
    });
    mgrl::fuzz::refused_ok([&] { (void)mgrl::rl::load_prompts(path, tok, *chat, 32); });
  }
  return 0;
}
