// mode_render.cpp: `mgrl render`: what each line of a JSONL file becomes for the model (the text, the token ids and
// the loss mask, "assistant_mask"), one JSON line per input line on standard output (rank 0), made by the same
// functions SFT (train::example_of: every SFT form, {"messages"} ending with an assistant turn, prompt-completion,
// {"text"}), GRPO and generate (io::ChatTemplate::encode: {"messages"} ending before the assistant) use.
#include <iostream>

#include "app/modes.h"
#include "core/error.h"
#include "dist/mpi_env.h"
#include "io/chat_template.h"
#include "io/config.h"
#include "io/jsonl.h"
#include "io/tokenizer.h"
#include "train/data.h"

namespace mgrl::app {

int run_render(Context& ctx) {
  const auto& cfg = ctx.cfg;
  const std::string input = cfg.get_string("data.input");
  std::vector<nlohmann::json> out;
  ctx.env.agree([&] {
    // Only the tokenizer is needed: model.tokenizer, else model.path (required of render until 2026-11-28, and then
    // named as not used when model.tokenizer was given).
    const std::string dir = tokenizer_dir(cfg);
    if (dir.empty())
      throw UserError("missing required key 'model.tokenizer' for mode render: the directory of tokenizer.json (or set "
                      "model.path)");
    const io::Tokenizer tok = io::Tokenizer::from_dir(dir);
    const io::ChatTemplate chat = chat_template(cfg, "train.chat_format", tok);
    train::DataOptions d;
    d.max_seq_len = static_cast<int>(cfg.get_int("train.max_seq_len"));
    d.completion_only = cfg.get_bool("train.completion_only_loss");
    d.text_field = cfg.get_string("data.text_field");
    d.eos = eos_token(cfg, tok);
    d.chat = &chat;
    io::read_jsonl(input, [&](const nlohmann::ordered_json& j, int line) {
      nlohmann::json row = {{"index", line - 1}};
      try {
        const bool chat_prompt = j.contains("messages") && (io::ChatTemplate::check_messages(j["messages"]),
                                                            j["messages"].back()["role"] != "assistant");
        if (!chat_prompt) {  // an SFT example in any of its forms: the tokens and loss mask SFT trains on
          std::string text;
          const train::Example ex = train::example_of(j, tok, d, &text);
          std::vector<int> mask(ex.tokens.size(), 0);
          for (std::size_t t = 0; t < mask.size(); ++t)
            mask[t] = ex.loss_mask.empty() ? (static_cast<std::int32_t>(t) >= ex.prompt_len) : ex.loss_mask[t];
          row["use"] = "sft";
          row["text"] = text;
          row["tokens"] = ex.tokens;
          row["assistant_mask"] = mask;
        } else {  // a prompt: what GRPO and generate give the model, the generation prompt added
          const nlohmann::ordered_json& m = j["messages"];
          row["use"] = "prompt";
          const io::ChatExtras extras = io::ChatExtras::of(j);
          row["text"] = chat.text(m, true, extras);
          const auto tokens = chat.encode(m, true, extras);
          row["tokens"] = tokens;
          row["assistant_mask"] = std::vector<int>(tokens.size(), 0);
        }
      } catch (const UserError& e) {
        io::jsonl_error(input, line, e.what());
      }
      out.push_back(std::move(row));
    });
  });
  if (ctx.env.rank() != 0) return 0;
  for (const auto& row : out) std::cout << row.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  return 0;
}

}  // namespace mgrl::app
