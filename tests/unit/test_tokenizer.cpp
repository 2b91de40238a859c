// test_tokenizer.cpp: src/io/tokenizer against the Hugging Face `tokenizers` library (the fixtures of
// tests/data/tokenizers, written by tools/make_tokenizer_fixtures.py), the chat formats against the
// documented templates, and the errors for what is not supported.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.h"
#include "io/tokenizer.h"
#include "io/unicode.h"

namespace mgrl::io {
namespace {

using json = nlohmann::json;

const std::string kDataDir = std::string(MGRL_TEST_DATA_DIR) + "/tokenizers";

const std::vector<std::string> kFixtures = {"llama3_bytelevel",  "qwen2_bytelevel",  "gpt2_bytelevel",
                                            "roberta_bytelevel", "splits_bytelevel", "llama2_sentencepiece",
                                            "metaspace_first",   "metaspace_split",  "sentencepiece_unk",
                                            "metaspace_strip",   "added_ids"};

std::string show(const std::string& s) { return json(s).dump(); }

std::string show(const std::vector<int32_t>& ids) { return json(ids).dump(); }

std::vector<json> read_cases(const std::string& name) {
  std::ifstream in(kDataDir + "/" + name + "/cases.jsonl");
  EXPECT_TRUE(in.good()) << "missing " << kDataDir << "/" << name << "/cases.jsonl";
  std::vector<json> cases;
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) cases.push_back(json::parse(line));
  return cases;
}

template <typename F>
std::string user_error(F&& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no UserError)";
}

std::string temp_dir(const std::string& name) {
  const std::string d = ::testing::TempDir() + "mgrl_tok_" + name;
  ::mkdir(d.c_str(), 0755);
  return d;
}

// ---- every case of every fixture: ids and decodings equal to the library's ----

class Fixture : public ::testing::TestWithParam<std::string> {};

TEST_P(Fixture, MatchesHuggingFace) {
  const std::string name = GetParam();
  const Tokenizer tok = Tokenizer::from_dir(kDataDir + "/" + name);
  const auto cases = read_cases(name);
  ASSERT_GE(cases.size(), 50u);
  int roundtrips = 0;
  for (const auto& c : cases) {
    const std::string text = c["text"];
    SCOPED_TRACE(name + " text " + show(text));
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    const auto ids_ns = c["ids_no_special"].get<std::vector<int32_t>>();
    const auto got = tok.encode(text);
    const auto got_ns = tok.encode(text, false);
    EXPECT_EQ(show(got), show(ids));
    EXPECT_EQ(show(got_ns), show(ids_ns));
    EXPECT_EQ(show(tok.decode(ids)), show(c["decoded"].get<std::string>()));
    EXPECT_EQ(show(tok.decode(ids_ns)), show(c["decoded_no_special"].get<std::string>()));
    EXPECT_EQ(show(tok.decode(ids, true)), show(c["decoded_skip_special"].get<std::string>()));
    if (c["decoded_no_special"] == text) {  // the library round-trips this text: so must we
      EXPECT_EQ(show(tok.decode(got_ns)), show(text));
      ++roundtrips;
    }
  }
  RecordProperty("roundtrips", roundtrips);
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, Fixture, ::testing::ValuesIn(kFixtures),
                         [](const auto& info) { return info.param; });

// ---- facts from tokenizer_config.json ----

TEST(Tokenizer, ConfigFactsLlama3) {
  const Tokenizer tok = Tokenizer::from_dir(kDataDir + "/llama3_bytelevel");
  ASSERT_TRUE(tok.bos_id() && tok.eos_id());
  EXPECT_EQ(*tok.bos_id(), *tok.token_to_id("<|begin_of_text|>"));
  EXPECT_EQ(*tok.eos_id(), *tok.token_to_id("<|eot_id|>"));
  EXPECT_FALSE(tok.pad_id());
  EXPECT_NE(tok.chat_template().find("<|start_header_id|>"), std::string::npos);
  EXPECT_EQ(tok.chat_template_origin(), kDataDir + "/llama3_bytelevel/tokenizer_config.json (chat_template)");
  EXPECT_TRUE(tok.is_special(*tok.bos_id()));
  EXPECT_FALSE(tok.is_special(*tok.token_to_id("<tool_call>")));  // an added token, not special
  EXPECT_EQ(tok.vocab_size(), *tok.token_to_id("\n\n\n") + 1);    // the last added token
}

TEST(Tokenizer, ConfigFactsQwen2) {
  const Tokenizer tok = Tokenizer::from_dir(kDataDir + "/qwen2_bytelevel");
  EXPECT_FALSE(tok.bos_id());  // "bos_token": null
  ASSERT_TRUE(tok.eos_id() && tok.pad_id());
  EXPECT_EQ(*tok.eos_id(), *tok.token_to_id("<|im_end|>"));
  EXPECT_EQ(*tok.pad_id(), *tok.token_to_id("<|endoftext|>"));
  EXPECT_NE(tok.chat_template().find("<|im_start|>"), std::string::npos);
  EXPECT_EQ(Tokenizer::from_dir(kDataDir + "/gpt2_bytelevel").chat_template_origin(), "");
}

TEST(Tokenizer, WithoutConfigBosComesFromThePostProcessor) {
  const std::string d = temp_dir("noconfig");
  std::ifstream in(kDataDir + "/llama2_sentencepiece/tokenizer.json", std::ios::binary);
  std::ofstream(d + "/tokenizer.json", std::ios::binary) << in.rdbuf();
  std::remove((d + "/tokenizer_config.json").c_str());
  const Tokenizer tok = Tokenizer::from_file(d + "/tokenizer.json");
  ASSERT_TRUE(tok.bos_id());
  EXPECT_EQ(*tok.bos_id(), *tok.token_to_id("<s>"));
  EXPECT_FALSE(tok.eos_id());
  EXPECT_EQ(tok.chat_template(), "");
  EXPECT_TRUE(tok.special_token_strings().empty());
}

TEST(Tokenizer, TokenLookups) {
  const Tokenizer tok = Tokenizer::from_dir(kDataDir + "/llama2_sentencepiece");
  EXPECT_EQ(tok.token_to_id("<unk>"), 0);
  EXPECT_EQ(tok.token_to_id("<s>"), 1);
  EXPECT_EQ(tok.token_to_id("<0x41>"), 3 + 0x41);
  EXPECT_EQ(tok.id_to_token(2), "</s>");
  EXPECT_FALSE(tok.token_to_id("no such token"));
  EXPECT_FALSE(tok.id_to_token(-1));
  EXPECT_FALSE(tok.id_to_token(tok.vocab_size()));
  const int32_t extra = *tok.token_to_id("<extra>");  // a normalized added token
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    const auto t = tok.id_to_token(id);
    ASSERT_TRUE(t) << id;
    if (id != extra) {
      EXPECT_EQ(tok.token_to_id(*t), id);
    }
  }
  // as in Hugging Face, a normalized added token reads back in its normalized form ("▁" prepended)
  EXPECT_EQ(tok.id_to_token(extra), "\xE2\x96\x81<extra>");
  // ids that are no token are skipped, as in Hugging Face
  const auto ids = tok.encode("Hello world", false);
  auto with_bad = ids;
  with_bad.insert(with_bad.begin() + 1, 1 << 20);
  with_bad.push_back(-5);
  EXPECT_EQ(tok.decode(with_bad), tok.decode(ids));
}

TEST(Tokenizer, InvalidUtf8IsAUserError) {
  const Tokenizer tok = Tokenizer::from_dir(kDataDir + "/gpt2_bytelevel");
  EXPECT_NE(user_error([&] { tok.encode("ok \xC3\x28 bad"); }).find("not valid UTF-8 (byte 3)"), std::string::npos);
  EXPECT_NE(user_error([&] { tok.encode("\xED\xA0\x80"); }).find("not valid UTF-8"), std::string::npos);  // surrogate
}

TEST(Tokenizer, LongInputs) {
  const Tokenizer tok = Tokenizer::from_dir(kDataDir + "/qwen2_bytelevel");
  std::string text;
  for (int i = 0; i < 2000; ++i) text += "word" + std::to_string(i) + (i % 7 ? " " : "\n\n   \t");
  text += std::string(20000, ' ') + "end";  // a long white space run (regex lookahead, backtracking)
  text += std::string(3000, 'x') + "你好世界" + std::string(5000, '9');
  EXPECT_EQ(tok.decode(tok.encode(text)), text);
}

// ---- Unicode helpers ----

TEST(Unicode, LossyDecodingReplacesMaximalInvalidSubparts) {
  // as Rust's String::from_utf8_lossy: one U+FFFD per maximal invalid subpart
  EXPECT_EQ(unicode::utf8_lossy("a\xF0\x9F\x98"
                                "b"),
            "a\xEF\xBF\xBD"
            "b");
  EXPECT_EQ(unicode::utf8_lossy("\xFF\xFE"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(unicode::utf8_lossy("\xE0\x80\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(unicode::utf8_lossy("\xE2\x82\xAC\xE2\x82"), "\xE2\x82\xAC\xEF\xBF\xBD");
}

TEST(Unicode, RegexSpaceIsUnicodeWhiteSpace) {
  const unicode::Regex re(R"(\s+)");
  EXPECT_EQ(re.find_all("a\xC2\x85"
                        "b")
                .size(),
            1u);  // U+0085 NEL is white space
  EXPECT_EQ(re.find_all("a\xE1\xA0\x8E"
                        "b")
                .size(),
            0u);  // U+180E is not (PCRE2 alone says it is)
  EXPECT_EQ(unicode::Regex(R"([^\s\p{L}]+)").find_all("\xE1\xA0\x8E").size(), 1u);
  EXPECT_EQ(unicode::Regex::literal("a.b\\s(").find_all("xa.b\\s(y a_b").size(), 1u);
}

// ---- Oniguruma patterns as the tokenizers library matches them (tests/data/tokenizers/regex_onig.json, written
// by tools/make_regex_fixtures.py with the library itself) ----

json regex_fixture() {
  std::ifstream in(kDataDir + "/regex_onig.json");
  EXPECT_TRUE(in.good()) << "missing " << kDataDir << "/regex_onig.json";
  return json::parse(in);
}

TEST(Unicode, RegexClassesMatchOnigurumaOverEveryCodePoint) {
  const json fx = regex_fixture();
  // Compared: every code point of the sweep that PCRE2's Unicode tables (14 in Debian 12's 10.42) know, less the few
  // whose properties Unicode changed since (the library's Oniguruma has Unicode 16).
  const unicode::Regex unassigned(R"(\p{Cn})");
  std::set<char32_t> skip;
  for (const auto& c : fx["not_compared"]) skip.insert(c.get<char32_t>());
  std::vector<char32_t> points;
  for (const auto& r : fx["sweep"]) {
    for (char32_t c = r[0].get<char32_t>(); c <= r[1].get<char32_t>(); ++c) {
      if ((c >= 0xD800 && c <= 0xDFFF) || skip.count(c)) continue;
      std::string one;
      unicode::utf8_append(one, c);
      if (unassigned.find_all(one).empty()) points.push_back(c);
    }
  }
  ASSERT_GT(points.size(), 150000u);
  std::string text;
  std::vector<size_t> starts;  // byte offset of each point
  for (const char32_t c : points) {
    starts.push_back(text.size());
    unicode::utf8_append(text, c);
  }
  ASSERT_GE(fx["classes"].size(), 50u);
  for (const auto& cls : fx["classes"]) {
    const std::string pattern = cls["pattern"].get<std::string>();
    std::vector<std::pair<char32_t, char32_t>> want;
    for (const auto& r : cls["ranges"])
      for (char32_t c = r[0].get<char32_t>(); c <= r[1].get<char32_t>(); ++c)
        if (std::binary_search(points.begin(), points.end(), c)) {
          if (!want.empty() && want.back().second + 1 == c)
            want.back().second = c;
          else
            want.emplace_back(c, c);
        }
    std::vector<std::pair<char32_t, char32_t>> got;
    for (const auto& [b, e] : unicode::Regex(pattern).find_all(text)) {
      if (e == b) continue;
      size_t k = static_cast<size_t>(std::lower_bound(starts.begin(), starts.end(), b) - starts.begin());
      for (; k < starts.size() && starts[k] < e; ++k) {
        const char32_t c = points[k];
        if (!got.empty() && got.back().second + 1 == c)
          got.back().second = c;
        else
          got.emplace_back(c, c);
      }
    }
    if (got == want) continue;
    // name the first code point on which they differ
    const auto in = [](const std::vector<std::pair<char32_t, char32_t>>& rs, char32_t c) {
      for (const auto& r : rs)
        if (r.first <= c && c <= r.second) return true;
      return false;
    };
    for (const char32_t c : points) {
      if (in(got, c) != in(want, c)) {
        ADD_FAILURE() << "/" << pattern << "/ on U+" << std::hex << static_cast<uint32_t>(c) << ": mgrl "
                      << (in(got, c) ? "matches" : "does not match") << ", the tokenizers library "
                      << (in(want, c) ? "matches" : "does not");
        break;
      }
    }
  }
}

TEST(Unicode, RegexPatternsMatchOnigurumaOnTexts) {
  const json fx = regex_fixture();
  ASSERT_GE(fx["spans"].size(), 400u);
  for (const auto& sc : fx["spans"]) {
    const std::string pattern = sc["pattern"].get<std::string>(), text = sc["text"].get<std::string>();
    std::vector<std::pair<size_t, size_t>> got;
    for (const auto& m : unicode::Regex(pattern).find_all(text))
      if (m.second > m.first) got.push_back(m);
    std::vector<std::pair<size_t, size_t>> want;
    for (const auto& s : sc["spans"]) want.emplace_back(s[0].get<size_t>(), s[1].get<size_t>());
    EXPECT_EQ(got, want) << "/" << pattern << "/ on " << json(text).dump();
  }
}

// ---- chat formats: the documented templates, written out by hand ----

const std::vector<Message> kConversation = {
    {"system", "You are a helpful assistant."}, {"user", "What is 2+2?"}, {"assistant", "4"}, {"user", "And 3+3?"}};

TEST(Chat, ChatML) {
  EXPECT_EQ(apply_chat(kConversation, ChatFormat::ChatML, false),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
            "<|im_start|>assistant\n4<|im_end|>\n"
            "<|im_start|>user\nAnd 3+3?<|im_end|>\n");
  EXPECT_EQ(apply_chat({{"user", "  Hi \n"}}, ChatFormat::ChatML, true),  // ChatML keeps the content as it is
            "<|im_start|>user\n  Hi \n<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(apply_chat({}, ChatFormat::ChatML, true), "<|im_start|>assistant\n");
}

TEST(Chat, Llama3) {
  EXPECT_EQ(apply_chat(kConversation, ChatFormat::Llama3, true),
            "<|begin_of_text|>"
            "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n4<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nAnd 3+3?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  // the template trims each content (Jinja's trim: Python's str.strip)
  EXPECT_EQ(apply_chat({{"user", " \t\n Hi there \xE3\x80\x80\x1c\n"}}, ChatFormat::Llama3, false),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>");
}

TEST(Chat, None) {
  EXPECT_EQ(apply_chat({{"user", "Q: 2+2?\nA:"}, {"assistant", " 4"}}, ChatFormat::None, true), "Q: 2+2?\nA: 4");
}

TEST(Chat, Names) {
  EXPECT_EQ(chat_format_from_name("chatml"), ChatFormat::ChatML);
  EXPECT_EQ(chat_format_from_name("llama3"), ChatFormat::Llama3);
  EXPECT_EQ(chat_format_from_name("none"), ChatFormat::None);
  EXPECT_STREQ(chat_format_name(ChatFormat::Llama3), "llama3");
  EXPECT_NE(user_error([] { chat_format_from_name("llama2"); }).find("unknown chat format 'llama2'"),
            std::string::npos);
}

TEST(Chat, EncodeChatHasOneBos) {
  const Tokenizer tok = Tokenizer::from_dir(kDataDir + "/llama3_bytelevel");
  const auto ids = tok.encode_chat(kConversation, ChatFormat::Llama3, true);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids[0], *tok.bos_id());
  EXPECT_NE(ids[1], *tok.bos_id());
  EXPECT_EQ(std::count(ids.begin(), ids.end(), *tok.token_to_id("<|eot_id|>")), 4);
  EXPECT_EQ(tok.decode(ids), apply_chat(kConversation, ChatFormat::Llama3, true));
  // None: the post-processor adds the BOS as for any text
  const auto plain = tok.encode_chat({{"user", "Hello"}}, ChatFormat::None, false);
  EXPECT_EQ(plain, tok.encode("Hello"));
  EXPECT_EQ(plain[0], *tok.bos_id());

  const Tokenizer qwen = Tokenizer::from_dir(kDataDir + "/qwen2_bytelevel");
  const auto q = qwen.encode_chat({{"user", "Hi"}}, ChatFormat::ChatML, true);
  EXPECT_EQ(q[0], *qwen.token_to_id("<|im_start|>"));
  EXPECT_EQ(qwen.decode(q), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

// transformers' apply_chat_template with the fixtures' templates (chat.jsonl) gives the same text and ids: the
// built-in formats reproduce these two templates (the templates themselves: test_chat_template.cpp).
TEST(Chat, MatchesTransformers) {
  for (const char* name : {"llama3_bytelevel", "qwen2_bytelevel"}) {
    const Tokenizer tok = Tokenizer::from_dir(kDataDir + "/" + name);
    std::ifstream in(kDataDir + "/" + name + "/chat.jsonl");
    ASSERT_TRUE(in.good()) << name;
    int n = 0;
    for (std::string line; std::getline(in, line); ++n) {
      const json c = json::parse(line);
      std::vector<Message> messages;
      for (const auto& m : c["messages"]) messages.push_back({m["role"], m["content"]});
      const bool gen = c["add_generation_prompt"];
      const ChatFormat fmt = std::string(name) == "llama3_bytelevel" ? ChatFormat::Llama3 : ChatFormat::ChatML;
      EXPECT_EQ(show(apply_chat(messages, fmt, gen)), show(c["text"].get<std::string>())) << name;
      EXPECT_EQ(show(tok.encode_chat(messages, fmt, gen)), show(c["ids"].get<std::vector<int32_t>>()))
          << name;
    }
    EXPECT_EQ(n, 6) << name;
  }
}

// ---- errors: what is not supported is said, with the file ----

// Writes a tokenizer.json: a tiny byte-level BPE with `patch` merged into it.
std::string write_tokenizer(const std::string& name, const json& patch) {
  json j = {{"version", "1.0"},
            {"added_tokens", json::array()},
            {"normalizer", nullptr},
            {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
            {"post_processor", nullptr},
            {"decoder", {{"type", "ByteLevel"}}},
            {"model", {{"type", "BPE"}, {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}}}, {"merges", {"a b"}}}}};
  j.merge_patch(patch);
  const std::string d = temp_dir(name);
  std::ofstream(d + "/tokenizer.json") << j.dump();
  return d;
}

std::string load_error(const std::string& name, const json& patch) {
  const std::string d = write_tokenizer(name, patch);
  return user_error([&] { Tokenizer::from_dir(d); });
}

TEST(Errors, TinyTokenizerLoads) {
  const Tokenizer tok = Tokenizer::from_dir(write_tokenizer("tiny", json::object()));
  EXPECT_EQ(tok.encode("abba"), (std::vector<int32_t>{2, 1, 0}));
  EXPECT_EQ(tok.decode({2, 1, 0}), "abba");
  EXPECT_EQ(tok.vocab_size(), 3);
  // merges in the array form, and an id gap in the vocab
  const Tokenizer tok2 = Tokenizer::from_dir(write_tokenizer(
      "tiny2",
      {{"model", {{"vocab", {{"a", 0}, {"b", 5}, {"ab", 9}}}, {"merges", json::array({json::array({"a", "b"})})}}}}));
  EXPECT_EQ(tok2.encode("abab"), (std::vector<int32_t>{9, 9}));
  EXPECT_EQ(tok2.vocab_size(), 10);
  EXPECT_FALSE(tok2.id_to_token(3));
  // no decoder: the tokens joined by spaces, as in Hugging Face
  const Tokenizer tok3 = Tokenizer::from_dir(write_tokenizer("tiny3", {{"decoder", nullptr}}));
  EXPECT_EQ(tok3.decode({2, 1, 0}), "ab b a");
}

TEST(Tokenizer, ChatTemplateSources) {
  // the list form of tokenizer_config.json: the "default" entry
  const std::string a = write_tokenizer("tmpl_list", json::object());
  std::remove((a + "/chat_template.jinja").c_str());  // an earlier run's (below)
  std::ofstream(a + "/tokenizer_config.json") << json{{"chat_template",
                                                       {{{"name", "tool_use"}, {"template", "x"}},
                                                        {{"name", "default"}, {"template", "{{ '<|im_start|>' }}"}}}}}
                                                     .dump();
  EXPECT_EQ(Tokenizer::from_dir(a).chat_template(), "{{ '<|im_start|>' }}");
  EXPECT_EQ(Tokenizer::from_dir(a).chat_template_origin(), a + "/tokenizer_config.json (chat_template \"default\")");
  // chat_template.jinja, as newer transformers save it
  const std::string b = write_tokenizer("tmpl_jinja", json::object());
  std::ofstream(b + "/chat_template.jinja") << "{{ '<|start_header_id|>' }}";
  EXPECT_EQ(Tokenizer::from_dir(b).chat_template(), "{{ '<|start_header_id|>' }}");
  EXPECT_EQ(Tokenizer::from_dir(b).chat_template_origin(), b + "/chat_template.jinja");
  // both: the file wins, as in transformers' tokenizer loading (a model saved by transformers 5 keeps the template in
  // chat_template.jinja; an older tokenizer_config.json entry beside it is stale)
  std::ofstream(a + "/chat_template.jinja") << "{{ 'file' }}";
  EXPECT_EQ(Tokenizer::from_dir(a).chat_template(), "{{ 'file' }}");
  EXPECT_EQ(Tokenizer::from_dir(a).chat_template_origin(), a + "/chat_template.jinja");
}

TEST(Errors, UnsupportedComponents) {
  struct Case {
    const char* name;
    json patch;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"wordpiece", {{"model", {{"type", "WordPiece"}}}}, "unsupported model type 'WordPiece'"},
      {"unigram", {{"model", {{"type", "Unigram"}}}}, "unsupported model type 'Unigram'"},
      {"lowercase", {{"normalizer", {{"type", "Lowercase"}}}}, "unsupported normalizer 'Lowercase'"},
      {"nested",
       {{"normalizer", {{"type", "Sequence"}, {"normalizers", {{{"type", "Precompiled"}}}}}}},
       "unsupported normalizer 'Precompiled'"},
      {"bertpre", {{"pre_tokenizer", {{"type", "BertPreTokenizer"}}}}, "unsupported pre_tokenizer 'BertPreTokenizer'"},
      {"whitespace",
       {{"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", {{{"type", "Whitespace"}}}}}}},
       "unsupported pre_tokenizer 'Whitespace'"},
      {"wpdecoder", {{"decoder", {{"type", "WordPiece"}}}}, "unsupported decoder 'WordPiece'"},
      {"postproc", {{"post_processor", {{"type", "Unknown"}}}}, "unsupported post_processor 'Unknown'"},
      {"behavior",
       {{"pre_tokenizer", {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "Sideways"}}}},
       "unsupported Split behavior 'Sideways'"},
      {"dropout", {{"model", {{"dropout", 0.1}}}}, "unsupported model BPE with dropout"},
      {"prefix", {{"model", {{"continuing_subword_prefix", "##"}}}}, "continuing_subword_prefix"},
      {"badmerge", {{"model", {{"merges", {"a c"}}}}}, "merge 1 (a c) uses a token not in the vocab"},
      {"badunk", {{"model", {{"unk_token", "<unk>"}}}}, "unk_token '<unk>' is not in the vocab"},
      {"badregex",
       {{"pre_tokenizer", {{"type", "Split"}, {"pattern", {{"Regex", "(ab"}}}, {"behavior", "Isolated"}}}},
       "bad regex"},
  };
  for (const auto& c : cases) {
    const std::string msg = load_error(c.name, c.patch);
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.name << ": " << msg;
    EXPECT_NE(msg.find(std::string("mgrl_tok_") + c.name + "/tokenizer.json: "), std::string::npos)
        << c.name << ": " << msg;
  }
}

TEST(Errors, Files) {
  EXPECT_NE(user_error([] { Tokenizer::from_dir("/nonexistent/dir"); }).find("/nonexistent/dir: no tokenizer.json"),
            std::string::npos);
  const std::string d = temp_dir("badjson");
  std::ofstream(d + "/tokenizer.json") << "{\"model\": [1, 2";
  EXPECT_NE(user_error([&] { Tokenizer::from_dir(d); }).find("tokenizer.json: invalid JSON"), std::string::npos);
  const std::string c = write_tokenizer("badconfig", json::object());
  std::ofstream(c + "/tokenizer_config.json") << R"({"bos_token": "<nope>"})";
  EXPECT_NE(
      user_error([&] { Tokenizer::from_dir(c); }).find("tokenizer_config.json: bos_token '<nope>' is not a token"),
      std::string::npos);
}

}  // namespace
}  // namespace mgrl::io
