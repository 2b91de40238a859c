// fuzz_jinja.cpp: the chat template interpreter (io/jinja.h) and chat rendering (io/chat_template.h): the input is a
// template, rendered through io::ChatTemplate (Qwen2 test tokenizer) over a fixed conversation with and without the
// generation prompt and with its assistant mask, then directly with other variables. Hangs, crashes and exceptions
// other than UserError are findings; the interpreter's limits must stop every hostile template.
#include <nlohmann/json.hpp>

#include "fuzz/fuzz_common.h"
#include "io/chat_template.h"
#include "io/jinja.h"
#include "io/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using mgrl::io::Tokenizer;
  static const Tokenizer tok = Tokenizer::from_file(MGRL_FUZZ_DATA_DIR "/tokenizers/qwen2_bytelevel/tokenizer.json");
  static const nlohmann::json messages = nlohmann::json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Q: 2+2? <think>"},
    {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4", "reasoning_content": null},
    {"role": "user", "content": " café\n"},
    {"role": "assistant", "content": "ok"}])");
  const std::string path = mgrl::fuzz::write_input("template.jinja", data, size);
  mgrl::fuzz::refused_ok([&] {
    mgrl::io::ChatOptions o;
    o.template_path = path;
    o.template_kwargs = R"({"enable_thinking": false, "date_string": "1 Jan 2026", "extra": [1, {"k": null}]})";
    const mgrl::io::ChatTemplate chat(tok, o);
    for (const bool gen : {false, true}) {
      mgrl::fuzz::refused_ok([&] { (void)chat.render(messages, gen); });
    }
  });
  mgrl::fuzz::refused_ok([&] {
    const mgrl::io::jinja::Template t(std::string(reinterpret_cast<const char*>(data), size), "fuzz.jinja");
    mgrl::io::jinja::Vars vars{{"messages", mgrl::io::jinja::Value::make_list({})},
                               {"x", mgrl::io::jinja::Value::integer(-3)},
                               {"s", mgrl::io::jinja::Value::string("a\xC3\xA9 b")},
                               {"f", mgrl::io::jinja::Value::number(0.1)}};
    (void)t.render(vars);
  });
  return 0;
}
