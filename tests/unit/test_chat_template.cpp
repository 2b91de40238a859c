// test_chat_template.cpp: the Jinja interpreter and chat rendering against transformers (the fixtures of
// tests/data/chat_templates, written by tools/make_chat_fixtures.py: text, ids and assistant masks), the
// interpreter's pieces one by one, and its errors (template name and line, exit-2 UserErrors, limits).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "io/chat_template.h"
#include "io/jinja.h"
#include "io/tokenizer.h"
#include "test_util.h"

namespace mgrl::io {
namespace {

using json = nlohmann::json;
using mgrl::test::error_of;
using mgrl::test::write_temp;

const std::string kData = std::string(MGRL_TEST_DATA_DIR);

std::string render(const std::string& src, const json& vars = json::object()) {
  jinja::Template t(src, "t.jinja");
  jinja::Vars v;
  for (auto it = vars.begin(); it != vars.end(); ++it) v.emplace_back(it.key(), jinja::from_json(it.value()));
  return t.render(v).text;
}

std::string render_error(const std::string& src, const json& vars = json::object()) {
  return error_of([&] { render(src, vars); });
}

// ---- transformers' renderings ----

TEST(ChatTemplate, MatchesTransformersOnTheFamilyTemplates) {
  std::ifstream f(kData + "/chat_templates/cases.jsonl");
  ASSERT_TRUE(f) << "missing fixture";
  std::string line;
  int n = 0, masks = 0, errors = 0;
  while (std::getline(f, line)) {
    const json c = json::parse(line);
    const std::string what = c["template"].get<std::string>() + "/" + c["case"].get<std::string>() +
                             " gen=" + c["add_generation_prompt"].dump() + " kwargs=" + c["kwargs"].dump();
    const std::string tok_name = c["tokenizer"].get<std::string>();
    const Tokenizer tok = Tokenizer::from_dir(tok_name.find('/') != std::string::npos
                                                  ? std::string(MGRL_SOURCE_DIR) + "/" + tok_name
                                                  : kData + "/tokenizers/" + tok_name);
    ChatOptions o;
    o.template_path = kData + "/chat_templates/" + c["template"].get<std::string>() + ".jinja";
    o.template_kwargs = c["kwargs"].dump();
    const ChatTemplate chat(tok, o);
    const bool gen = c["add_generation_prompt"].get<bool>();
    ++n;
    if (c.contains("error")) {
      const std::string e = error_of([&] { chat.text(c["messages"], gen); });
      EXPECT_NE(e.find("the chat template raised an error: " + c["error"].get<std::string>()), std::string::npos)
          << what << ": " << e;
      EXPECT_NE(e.find(o.template_path + ":"), std::string::npos) << e;
      ++errors;
      continue;
    }
    const RenderedChat r = chat.render(c["messages"], gen);
    EXPECT_EQ(json(r.text).dump(), c["text"].dump()) << what;
    EXPECT_EQ(json(r.tokens).dump(), c["ids"].dump()) << what;
    EXPECT_EQ(json(chat.encode(c["messages"], gen)).dump(), c["ids"].dump()) << what;
    EXPECT_EQ(json(r.mask).dump(), c["mask"].dump()) << what << " (" << c["mask_source"].get<std::string>() << ")";
    int ones = 0;
    for (auto m : r.mask) ones += m;
    masks += ones > 0;
  }
  EXPECT_GE(n, 100);
  EXPECT_GE(masks, 40);  // most conversations have trained assistant tokens
  EXPECT_EQ(errors, 4);  // gemma and mistral refuse roles that do not alternate
}

TEST(ChatTemplate, TokenizerTemplateAndSpecialTokens) {
  // the llama3 fixture tokenizer carries its template in tokenizer_config.json; chat.jsonl is transformers'
  const Tokenizer tok = Tokenizer::from_dir(kData + "/tokenizers/llama3_bytelevel");
  EXPECT_NE(tok.chat_template_origin().find("tokenizer_config.json (chat_template)"), std::string::npos);
  const ChatTemplate chat(tok, ChatOptions{});
  std::ifstream f(kData + "/tokenizers/llama3_bytelevel/chat.jsonl");
  std::string line;
  int n = 0;
  while (std::getline(f, line)) {
    const json c = json::parse(line);
    EXPECT_EQ(chat.text(c["messages"], c["add_generation_prompt"].get<bool>()), c["text"].get<std::string>());
    EXPECT_EQ(json(chat.encode(c["messages"], c["add_generation_prompt"].get<bool>())), c["ids"]);
    ++n;
  }
  EXPECT_GT(n, 0);
  bool bos = false;
  for (const auto& kv : tok.special_token_strings()) bos = bos || (kv.first == "bos_token" && kv.second == "<|begin_of_text|>");
  EXPECT_TRUE(bos);
}

TEST(ChatTemplate, NoTemplateIsAnErrorOnlyWhenAConversationIsRendered) {
  const Tokenizer tok = Tokenizer::from_dir(kData + "/tokenizers/gpt2_bytelevel");
  const ChatTemplate chat(tok, ChatOptions{});
  EXPECT_FALSE(chat.has_template());
  const std::string e = error_of([&] { chat.text(json::parse(R"([{"role":"user","content":"x"}])"), true); });
  EXPECT_NE(e.find("has no chat template"), std::string::npos) << e;
  EXPECT_NE(e.find("chat.template"), std::string::npos) << e;
  // a built-in format named explicitly still works
  ChatOptions o;
  o.format = "chatml";
  EXPECT_EQ(ChatTemplate(tok, o).text(json::parse(R"([{"role":"user","content":"x"}])"), true),
            "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, BuiltinFormatMaskCoversTheAssistantTurns) {
  const Tokenizer tok = Tokenizer::from_dir(kData + "/tokenizers/qwen2_bytelevel");
  ChatOptions o;
  o.format = "chatml";
  const auto msgs = json::parse(R"([{"role":"user","content":"Hi"},{"role":"assistant","content":"Hello there"}])");
  const RenderedChat r = ChatTemplate(tok, o).render(msgs, false);
  ASSERT_EQ(r.spans.size(), 1u);
  EXPECT_EQ(r.text.substr(r.spans[0].first, r.spans[0].second - r.spans[0].first), "Hello there<|im_end|>\n");
  std::string trained;
  for (std::size_t t = 0; t < r.tokens.size(); ++t)
    if (r.mask[t]) trained += tok.decode({r.tokens[t]});
  EXPECT_EQ(trained, "Hello there<|im_end|>\n");
}

// What `mgrl export` writes as the model's template for a run that trained with a built-in format: rendered as a
// Jinja template (as transformers renders it), it gives the built-in format's text and token ids, with and without
// the generation prompt, whitespace around contents included (llama3 trims it).
TEST(ChatTemplate, BuiltinFormatsAsJinjaTemplatesRenderTheSame) {
  const Tokenizer tok = Tokenizer::from_dir(kData + "/tokenizers/qwen2_bytelevel");
  const auto convs = json::parse(R"([
    [{"role":"user","content":"Hi"}],
    [{"role":"system","content":"  Be brief.\n"},{"role":"user","content":"2+2?"},{"role":"assistant","content":" 4 \n\n"}],
    [{"role":"user","content":""},{"role":"assistant","content":"caf\u00e9 \u00a0"},{"role":"tool","content":"{\"a\": 1}"}]
  ])");
  for (const char* name : {"chatml", "llama3"}) {
    const std::string jinja_text = builtin_chat_template(chat_format_from_name(name));
    ASSERT_FALSE(jinja_text.empty()) << name;
    ChatOptions builtin, as_jinja;
    builtin.format = name;
    as_jinja.template_path = write_temp(std::string(name) + ".jinja", jinja_text);
    const ChatTemplate a(tok, builtin), b(tok, as_jinja);
    for (const auto& msgs : convs)
      for (const bool gen : {false, true}) {
        EXPECT_EQ(b.text(msgs, gen), a.text(msgs, gen)) << name << " " << msgs.dump() << " gen=" << gen;
        EXPECT_EQ(b.encode(msgs, gen), a.encode(msgs, gen)) << name << " " << msgs.dump() << " gen=" << gen;
      }
  }
  EXPECT_EQ(builtin_chat_template(ChatFormat::None), "");
}

TEST(ChatTemplate, KwargsAreCheckedAndOverrideSpecialTokens) {
  const Tokenizer tok = Tokenizer::from_dir(kData + "/tokenizers/llama3_bytelevel");
  ChatOptions o;
  o.template_path = write_temp("bos.jinja", "{{ bos_token }}|{{ eos_token }}|{{ flag }}");
  o.template_kwargs = R"({"eos_token": "E", "flag": [1, "x"]})";
  EXPECT_EQ(ChatTemplate(tok, o).text(json::array(), false), "<|begin_of_text|>|E|[1, 'x']");
  o.template_kwargs = "[1]";
  EXPECT_NE(error_of([&] { ChatTemplate(tok, o); }).find("chat.template_kwargs: must be a JSON object"), std::string::npos);
  o.template_kwargs = "{bad";
  EXPECT_NE(error_of([&] { ChatTemplate(tok, o); }).find("chat.template_kwargs: not valid JSON"), std::string::npos);
  o.template_kwargs = R"({"messages": 1})";
  EXPECT_NE(error_of([&] { ChatTemplate(tok, o); }).find("'messages' is set by mgrl"), std::string::npos);
  o.template_path = "/nonexistent/t.jinja";
  EXPECT_NE(error_of([&] { ChatTemplate(tok, o); }).find("/nonexistent/t.jinja: cannot open"), std::string::npos);
}

// ---- the interpreter's pieces ----

TEST(Jinja, WhitespaceControlAsTransformersConfiguresIt) {
  // trim_blocks: the newline after a block tag goes; lstrip_blocks: indentation before a block tag goes
  EXPECT_EQ(render("{% if true %}\n  yes\n  {% endif %}\nend"), "  yes\nend");
  EXPECT_EQ(render("a  {%- if true -%}  b  {%- endif -%}  c"), "abc");
  EXPECT_EQ(render("a \n {{- 'b' -}} \n c"), "abc");
  EXPECT_EQ(render("  {%+ if true %}x{% endif %}"), "  x");             // + keeps the indentation
  EXPECT_EQ(render("{% if true +%}\nx{% endif %}"), "\nx");             // + keeps the newline
  EXPECT_EQ(render("{# comment #}\nx\n"), "x");                          // one trailing newline dropped
  EXPECT_EQ(render("x\n\n"), "x\n");
  EXPECT_EQ(render("a\r\nb"), "a\nb");
  EXPECT_EQ(render("{% raw %}{{ x }}{% endraw %}"), "{{ x }}");
  EXPECT_EQ(render("  {{ 'v' }}\n"), "  v");                             // lstrip is for blocks only
}

TEST(Jinja, ExpressionsFollowPython) {
  EXPECT_EQ(render("{{ 7 // -2 }} {{ 7 % -3 }} {{ 1 / 4 }} {{ 2 ** -1 }} {{ 10 / 5 }}"), "-4 -2 0.25 0.5 2.0");
  EXPECT_EQ(render("{{ 1e-5 }} {{ 123456789012345678.0 }} {{ 0.5 + 1 }} {{ -0.0 }}"), "1e-05 1.2345678901234568e+17 1.5 -0.0");
  EXPECT_EQ(render("{{ none }} {{ true }} {{ [1, 'a', none] }} {{ {'k': (1, 2)} }} {{ (1,) }}"),
            "None True [1, 'a', None] {'k': (1, 2)} (1,)");
  EXPECT_EQ(render("{{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' ~ 2 }} {{ 1 < 2 > 0 }} {{ 3 > 2 > 1 }} {{ (3 > 2) > 1 }}"),
            "True True a2 True True False");
  EXPECT_EQ(render("{{ 'x' if false }}|{{ undefined_name }}|{{ [1, 2, 3][-1] }}|{{ 'héllo'[1] }}|{{ 'héllo'[1:3] }}"),
            "||3|é|él");
  EXPECT_EQ(render("{{ -(x|length) }}", {{"x", "abc"}}), "-3");
  EXPECT_EQ(render_error("{{ -x|length }}", {{"x", "abc"}}), "t.jinja:1: bad operand type for unary -: 'string'");  // as jinja2
  EXPECT_EQ(render("{{ m.a.b }} {{ m['a']['b'] }} {{ m.missing is defined }} {{ m.get('a').b }}", {{"m", {{"a", {{"b", 5}}}}}}),
            "5 5 False 5");
  EXPECT_EQ(render("{{ \"it's\" }} {{ 'a\\tb\\u00e9' }} {{ 'a' 'b' }}"), "it's a\tbé ab");
}

TEST(Jinja, StatementsScopesAndLoops) {
  // a set inside a loop does not leak out; a namespace carries values out
  EXPECT_EQ(render("{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }}{% endfor %}{{ x }}"), "231");
  EXPECT_EQ(render("{% for i in [1, 2] %}{% if loop.first %}{% set y = 5 %}{% endif %}{{ y }};{% endfor %}{{ y }}"), "5;;");
  EXPECT_EQ(render("{% set ns = namespace(t=0) %}{% for i in range(4) %}{% set ns.t = ns.t + i %}{% endfor %}{{ ns.t }}"), "6");
  EXPECT_EQ(render("{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }},{% endfor %}"), "3,7,");
  EXPECT_EQ(render("{% for x in 'ab' %}{{ loop.index }}{{ x }}{{ loop.nextitem }}{% endfor %}"), "1ab2b");
  EXPECT_EQ(render("{% for k in {'b': 1, 'a': 2} %}{{ k }}{% endfor %}"), "ba");
  EXPECT_EQ(render("{% if 0 %}a{% elif '' %}b{% elif [0] %}c{% else %}d{% endif %}"), "c");
  EXPECT_EQ(render("{% macro f(a, b=2) %}{{ a }}-{{ b }}{% endmacro %}{{ f(1) }} {{ f(b=3, a=4) }}"), "1-2 4-3");
  EXPECT_EQ(render("{% macro r(n) %}{% if n > 0 %}{{ n }}{{ r(n - 1) }}{% endif %}{% endmacro %}{{ r(3) }}"), "321");
  EXPECT_EQ(render("{% set a, b = 1, 2 %}{{ b }}{{ a }}"), "21");
  EXPECT_EQ(render("{% set d = dict(a=1) %}{{ d.a }}{{ d | tojson }}"), "1{\"a\": 1}");
}

TEST(Jinja, FiltersTestsAndMethods) {
  const json msgs = json::parse(R"([{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"user","content":"c"}])");
  EXPECT_EQ(render("{{ m | selectattr('role', 'eq', 'user') | map(attribute='content') | join('+') }}", {{"m", msgs}}), "a+c");
  EXPECT_EQ(render("{{ m | rejectattr('role', 'in', ['user']) | list | length }}", {{"m", msgs}}), "1");
  EXPECT_EQ(render("{{ [1, 2, 3, 4] | select('odd') | list }} {{ ['a', 'B'] | map('upper') | list }}"), "[1, 3] ['A', 'B']");
  EXPECT_EQ(render("{{ ' x '|trim }}|{{ 'xxaxx'|trim('x') }}|{{ 'a-b-c'.split('-', 1) }}|{{ 'a-b-c'.rsplit('-', 1) }}"),
            "x|a|['a', 'b-c']|['a-b', 'c']");
  EXPECT_EQ(render("{{ 'Hi' is string }} {{ 3 is integer }} {{ 3.0 is float }} {{ true is boolean }} {{ none is not none }}"),
            "True True True True False");
  EXPECT_EQ(render("{{ 'abc'.startswith(('x', 'a')) }} {{ 'abc'.find('c') }} {{ 'a b'.title() }} {{ 'ÉA'.lower() }}"),
            "True 2 A B éa");
  // Python's round(): an int stays an int, halves to the even neighbour of the exact binary value; int()/float() of
  // a string read decimal only. Expected strings from jinja2 3.1.6 (until 2026-11-28: 7.0|3.0|...|2.68, and 31).
  EXPECT_EQ(render("{{ 7|round }}|{{ 2.5|round }}|{{ 3.5|round }}|{{ 2.675|round(2) }}|{{ -0.5|round }}|"
                   "{{ 1234.5|round(-2) }}|{{ 15|round(-1) }}|{{ 2.5|round(0, 'floor') }}"),
            "7|2.0|4.0|2.67|-0.0|1200.0|20|2.0");
  EXPECT_EQ(render("{{ '0x1f'|int }}|{{ '0x1f'|float }}|{{ ' 42 '|int }}|{{ '4.7'|int }}|{{ 4.7|int }}|{{ 'abc'|int(5) }}"),
            "0|0.0|42|4|4|5");
  EXPECT_NE(render_error("{{ 1e20|int }}").find("filter 'int': 1e+20 is beyond a 64-bit integer"), std::string::npos);
  EXPECT_NE(render_error("{{ 2.5|round(0, 'up') }}").find("method must be 'common', 'ceil' or 'floor'"), std::string::npos);
  // Jinja's |title splits words at whitespace, '-', '(', '{', '[', '<' only; the .title() method is Python's str.title
  // (until 2026-11-28 the filter was str.title too: "<Tool_Response>R"). Expected strings from jinja2 3.1.6.
  EXPECT_EQ(render("{{ '<tool_response>r'|title }}|{{ 'hello-world foo(bar)baz x_y'|title }}|{{ \"o'neil mc-donald\"|title }}"),
            "<Tool_response>r|Hello-World Foo(Bar)baz X_y|O'neil Mc-Donald");
  EXPECT_EQ(render("{{ 'hello-world foo(bar)baz x_y'.title() }}"), "Hello-World Foo(Bar)Baz X_Y");
  EXPECT_EQ(render("{{ {'z': [1, 'é\"'], 'a': none} | tojson }}"), "{\"z\": [1, \"é\\\"\"], \"a\": null}");
  EXPECT_EQ(render("{{ {'z': 1, 'a': 2} | tojson(sort_keys=true) }}"), "{\"a\": 2, \"z\": 1}");
  EXPECT_EQ(render("{{ '\\x01\\x7f\\n' | tojson }} {{ ['\\x7f'] }}"), "\"\\u0001\x7f\\n\" ['\\x7f']");  // as json.dumps, repr
  EXPECT_EQ(render("{{ 'ß'.upper() }}"), "ẞ");  // utf8proc's one-character mapping (Python: 'SS'), a documented difference
  EXPECT_EQ(render("{{ x | default('d') }} {{ 0 | default('d', true) }} {{ [] | first }}|{{ 'abc' | list }}"), "d d |['a', 'b', 'c']");
}

// ---- errors: a line number, a clear message, never a silent misrender ----

TEST(Jinja, UnsupportedConstructsNameTheLine) {
  EXPECT_EQ(render_error("a\n{% include 'x' %}"), "t.jinja:2: unsupported Jinja statement '{% include %}' (mgrl's template subset: docs/sft.md)");
  EXPECT_EQ(render_error("\n\n{{ x | wordwrap }}"), "t.jinja:3: unsupported filter 'wordwrap' (mgrl's template subset: docs/sft.md)");
  EXPECT_EQ(render_error("{{ 'a'.zfill(3) }}"), "t.jinja:1: unsupported method string.zfill() (mgrl's template subset: docs/sft.md)");
  EXPECT_EQ(render_error("{% for x in y recursive %}{% endfor %}"), "t.jinja:1: unsupported: recursive for loops");
  EXPECT_EQ(render_error("{{ 1 is prime }}"), "t.jinja:1: unsupported test 'prime' (mgrl's template subset: docs/sft.md)");
  EXPECT_EQ(render_error("{% if x %}\n\nno end"), "t.jinja:2: unexpected end of template; expected '{% endif %}'");
  EXPECT_EQ(render_error("{{ (1 }}"), "t.jinja:1: unexpected '}', expected ')'");
  EXPECT_EQ(render_error("{% break %}"), "t.jinja:1: 'break' outside a loop");
  EXPECT_EQ(render_error("line1\n{{ 'x' + 1 }}"), "t.jinja:2: unsupported operand types for +: 'string' and 'int'");
  EXPECT_EQ(render_error("{{ a.b.c }}"), "t.jinja:1: 'a' is undefined (reading .b)");
  EXPECT_EQ(render_error("{{ raise_exception('bad ' ~ 1) }}"), "t.jinja:1: the chat template raised an error: bad 1");
  EXPECT_EQ(render_error("{# open"), "t.jinja:1: missing end of comment tag");
  EXPECT_EQ(render_error("{{ 'abc }}"), "t.jinja:1: unterminated string");
}

TEST(Jinja, HostileTemplatesEndWithAnError) {
  EXPECT_NE(render_error("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}").find("too many steps"),
            std::string::npos);
  EXPECT_NE(render_error("{{ range(1000000) }}").find("range() longer than"), std::string::npos);
  EXPECT_NE(render_error("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}").find("deeper than 64"), std::string::npos);
  EXPECT_NE(render_error("{{ 'x' * 100000000 }}").find("larger than the template limit"), std::string::npos);
  EXPECT_NE(render_error("{% set s = namespace(v='x') %}{% for i in range(40) %}{% set s.v = s.v ~ s.v %}{% endfor %}").find("16 MiB"),
            std::string::npos);
  EXPECT_NE(render_error("{{ " + std::string(2000, '(') + "1" + std::string(2000, ')') + " }}").find("nests deeper than 128"),
            std::string::npos);
  EXPECT_NE(render_error("{{ " + std::string(5000, '[') + std::string(5000, ']') + " }}").find("nests deeper than 128"),
            std::string::npos);
  EXPECT_NE(render_error("{{ " + std::string(5000, '[') + " }}").find("unexpected '}', expected ']'"), std::string::npos);
  std::string chain = "{{ 1";
  for (int i = 0; i < 5000; ++i) chain += " + 1";
  EXPECT_NE(render_error(chain + " }}").find("an expression nested deeper than 256 levels"), std::string::npos);
  EXPECT_EQ(render_error("{% set ns = namespace(v=1) %}{% for i in range(600) %}{% set ns.v = [ns.v] %}{% endfor %}"),
            "t.jinja: a list nested deeper than 512 levels");
  std::string ifs, endifs;
  for (int i = 0; i < 40; ++i) ifs += "{% if n %}", endifs += "{% endif %}";
  EXPECT_NE(render_error("{% macro m(n) %}" + ifs + "{{ m(n - 1) }}" + endifs + "{% endmacro %}{{ m(60) }}")
                .find("nests too deeply while rendering"),
            std::string::npos);
  std::string deep_json = "{\"x\": " + std::string(1000, '[') + std::string(1000, ']') + "}";
  EXPECT_NE(error_of([&] { render("{{ x }}", json::parse(deep_json)); }).find("nested deeper than 512"), std::string::npos);
  EXPECT_NE(render_error("{{ 9223372036854775807 + 1 }}").find("integer overflow"), std::string::npos);
  EXPECT_NE(render_error("{{ 1 // 0 }}").find("division or modulo by zero"), std::string::npos);
}

TEST(Jinja, GenerationSpans) {
  jinja::Template t("a{% generation %}b{{ 'c' }}{% endgeneration %}d{% generation %}{% endgeneration %}", "g");
  EXPECT_TRUE(t.marks_generation());
  const auto out = t.render({});
  EXPECT_EQ(out.text, "abcd");
  ASSERT_EQ(out.generation.size(), 2u);
  EXPECT_EQ(out.generation[0], std::make_pair(std::size_t{1}, std::size_t{3}));
  EXPECT_EQ(out.generation[1], std::make_pair(std::size_t{4}, std::size_t{4}));
  EXPECT_NE(error_of([] { jinja::Template("{% macro m() %}{% generation %}x{% endgeneration %}{% endmacro %}{{ m() }}", "g").render({}); })
                .find("g:1: unsupported: {% generation %} inside a macro"),
            std::string::npos);
}

}  // namespace
}  // namespace mgrl::io
