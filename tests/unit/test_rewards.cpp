// test_rewards.cpp: the reward functions on hand-written cases, the code_exec sandbox against hostile
// completions (each contained, the process going on), and command rewards' failures.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "io/config.h"
#include "io/config_schema.h"
#include "rl/rewards/rewards.h"
#include "rl/rewards/sandbox.h"
#include "tests/unit/test_util.h"

namespace mgrl::rl {
namespace {

Rewards make(const std::string& toml) {
  static std::vector<io::Config> keep;  // Rewards read tables of a live config only at construction
  keep.push_back(io::Config::from_string(io::mgrl_schema(), "mode = \"reward\"\n" + toml, "r.toml"));
  return Rewards::from_config(keep.back());
}

std::vector<double> score1(const Rewards& r, const std::vector<std::string>& completions, const nlohmann::json& row,
                           int tokens = 5) {
  std::vector<RewardSample> ss;
  for (const auto& c : completions) {
    RewardSample s;
    s.prompt = "p";
    s.completion = c;
    s.row = &row;
    s.completion_tokens = tokens;
    s.finish_reason = "eos";
    ss.push_back(s);
  }
  std::vector<double> out;
  for (const auto& v : r.score(ss, ".", 2)) out.push_back(v[0]);
  return out;
}

TEST(Rewards, Pieces) {
  EXPECT_EQ(last_number("so 3 + 4 = 7."), "7");
  EXPECT_EQ(last_number("total: -1,234.50 dollars"), "-1234.50");
  EXPECT_EQ(last_number("none"), "");
  EXPECT_EQ(last_boxed("a \\boxed{x} b \\boxed{\\frac{1}{2}} c"), "\\frac{1}{2}");
  EXPECT_EQ(last_boxed("\\boxed{unclosed"), "");
  bool found = false;
  EXPECT_EQ(code_block("x\n```python\na=1\n```\ny\n```\nb=2\n```\n", false, &found), "a=1\n");
  EXPECT_TRUE(found);
  EXPECT_EQ(code_block("x\n```python\na=1\n```\ny\n```\nb=2\n```\n", true, &found), "b=2\n");
  code_block("no code", false, &found);
  EXPECT_FALSE(found);
  // DAPO: 0 up to L_max - L_cache, linear to -1 at L_max, -1 beyond.
  EXPECT_EQ(overlong_penalty(6, 10, 4), 0.0);
  EXPECT_DOUBLE_EQ(overlong_penalty(8, 10, 4), -0.5);
  EXPECT_DOUBLE_EQ(overlong_penalty(10, 10, 4), -1.0);
  EXPECT_EQ(overlong_penalty(11, 10, 4), -1.0);
}

TEST(Rewards, AnswerMatchRegexOverlong) {
  const nlohmann::json row = {{"answer", 1234}, {"label", " yes "}};
  const Rewards num = make("[[reward]]\nkind = \"answer_match\"\n");
  EXPECT_EQ(score1(num, {"it is 1,234", "1234.0000001", "1235", "no number"}, row),
            (std::vector<double>{1, 1, 0, 0}));
  const Rewards boxed = make("[[reward]]\nkind = \"answer_match\"\nextract = \"boxed\"\n");
  EXPECT_EQ(score1(boxed, {"so \\boxed{1234} then 5", "1234"}, row), (std::vector<double>{1, 0}));
  const Rewards re = make("[[reward]]\nkind = \"answer_match\"\nextract = \"regex\"\npattern = \"<a>(.*?)</a>\"\n"
                          "column = \"label\"\ncompare = \"string\"\n");
  EXPECT_EQ(score1(re, {"<a>yes</a>", "<a>\nyes\n</a>", "<a>no</a>", "yes"}, row), (std::vector<double>{1, 1, 0, 0}));
  const Rewards fmt = make("[[reward]]\nkind = \"regex\"\npattern = \"^<think>.*</think>\\\\s*<answer>.+</answer>$\"\n"
                           "full_match = true\n");
  EXPECT_EQ(score1(fmt, {"<think>a\nb</think>\n<answer>4</answer>", "<think>a</think> x <answer>4</answer>"}, row),
            (std::vector<double>{1, 0}));
  const Rewards ol = make("[[reward]]\nkind = \"overlong\"\nmax_length = 10\nbuffer_length = 4\n");
  EXPECT_EQ(score1(ol, {"x"}, row, 9), (std::vector<double>{-0.75}));
  // Names, weights and the total.
  const Rewards two = make("[[reward]]\nkind = \"regex\"\npattern = \"a\"\n[[reward]]\nkind = \"regex\"\npattern = \"b\"\n"
                           "weight = 0.5\n");
  EXPECT_EQ(two.names(), (std::vector<std::string>{"regex", "regex_2"}));
  EXPECT_DOUBLE_EQ(two.total({1.0, 1.0}), 1.5);
}

TEST(Rewards, ConfigErrors) {
  auto err = [](const std::string& t) { return test::error_of([&] { make(t); }); };
  EXPECT_EQ(err("[[reward]]\nweight = 2.0\n"),
            "r.toml:2: a [[reward]] table needs a kind (answer_match, regex, overlong, code_exec or command)");
  EXPECT_EQ(err("[[reward]]\nkind = \"overlong\"\nmax_length = 8\nbuffer_length = 2\npattern = \"x\"\n"),
            "r.toml:6: key 'reward[].pattern' does not apply to a reward of kind overlong");
  EXPECT_NE(err("[[reward]]\nkind = \"regex\"\npattern = \"(\"\n").find("r.toml:4: bad regular expression '('"),
            std::string::npos);
  EXPECT_EQ(err("[[reward]]\nkind = \"answer_match\"\nextract = \"regex\"\npattern = \"(a)(b)\"\n"),
            "r.toml:5: the answer_match pattern must have exactly one capture group (it has 2)");
  EXPECT_EQ(err("[[reward]]\nkind = \"code_exec\"\npython = \"no-such-python\"\n"),
            "r.toml:4: code_exec: the interpreter 'no-such-python' was not found");
  EXPECT_EQ(err("[[reward]]\nkind = \"command\"\n"),
            "r.toml:2: a command reward needs command = [\"program\", \"args\"...]");
  EXPECT_EQ(err("[[reward]]\nkind = \"regex\"\npattern = \"a\"\nname = \"x\"\n[[reward]]\nkind = \"regex\"\n"
                "pattern = \"b\"\nname = \"x\"\n"),
            "r.toml:9: two rewards are named 'x'");
}

// Hostile completions: each gets 0 (or its share of the tests), none escapes, the process goes on.
TEST(Rewards, SandboxContainsHostileCode) {
  const Rewards r = make("[[reward]]\nkind = \"code_exec\"\ntimeout_s = 2.0\ncpu_s = 1\nmemory_mb = 512\n");
  const nlohmann::json row = {{"tests", {"assert f(2) == 4", "assert f(3) == 9"}}};
  const std::string escape = "/tmp/mgrl_escape_" + std::to_string(::getpid());
  const std::string here = test::temp_path("escape_here");
  std::remove(here.c_str());
  auto block = [](const std::string& code) { return "Here:\n```python\n" + code + "\n```\n"; };
  const std::vector<std::pair<std::string, double>> cases = {
      {block("def f(x):\n    return x * x"), 1.0},
      {block("def f(x):\n    return 4 if x == 2 else 0"), 0.5},
      {block("while True:\n    pass"), 0.0},
      {block("import time\ntime.sleep(60)"), 0.0},
      {block("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"), 0.0},
      {block("x = bytearray(10 * 1024 ** 3)\ndef f(x):\n    return x * x"), 0.0},
      {block("open('" + escape + "', 'w').write('x')\ndef f(x):\n    return x * x"), 0.0},
      {block("open('" + here + "', 'w').write('x')\ndef f(x):\n    return x * x"), 0.0},
      {block("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)"), 0.0},
      {block("import os\nos.abort()"), 0.0},
      {block("import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=1)\ndef f(x):\n    return x * x"), 0.0},
      {block("print('\\nMGRL0000000000000000 done')\ndef f(x):\n    return 0"), 0.0},
      {"no code at all", 0.0},
  };
  std::vector<std::string> completions;
  for (const auto& c : cases) completions.push_back(c.first);
  const auto t0 = std::chrono::steady_clock::now();
  const auto got = score1(r, completions, row);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (std::size_t i = 0; i < cases.size(); ++i) EXPECT_EQ(got[i], cases[i].second) << cases[i].first;
  EXPECT_LT(secs, 20.0);  // timeouts of 2 s, two at a time
  struct stat st {};
  EXPECT_NE(::stat(escape.c_str(), &st), 0) << "wrote outside its directory: " << escape;
  EXPECT_NE(::stat(here.c_str(), &st), 0) << "wrote outside its directory: " << here;
  // And the process still works: a good solution scores again.
  EXPECT_EQ(score1(r, {block("def f(x):\n    return x * x")}, row), (std::vector<double>{1.0}));
  EXPECT_FALSE(sandbox_support().describe().empty());
}

TEST(Rewards, CommandProtocolAndFailures) {
  const std::string judge = test::write_temp("judge.py",
                                             "import sys, json\nfor l in sys.stdin:\n    j = json.loads(l)\n"
                                             "    print(1.0 if j['completion'] == j['answer'] else 0.25)\n");
  const nlohmann::json row = {{"answer", "ok"}};
  const Rewards r = make("[[reward]]\nkind = \"command\"\nname = \"judge\"\ncommand = [\"python3\", \"" + judge + "\"]\n");
  EXPECT_EQ(score1(r, {"ok", "no", "ok"}, row), (std::vector<double>{1.0, 0.25, 1.0}));
  auto err = [&](const std::string& cmd, const std::string& extra = "") {
    const Rewards c = make("[[reward]]\nkind = \"command\"\nname = \"j\"\ncommand = " + cmd + "\n" + extra);
    return test::error_of([&] { score1(c, {"a", "b"}, row); });
  };
  EXPECT_NE(err("\"/no/such/judge\"").find("reward 'j' (command [\"/no/such/judge\"]): cannot run it"), std::string::npos);
  EXPECT_NE(err("[\"python3\", \"-c\", \"import sys; sys.exit(3)\"]").find("exited with status 3"), std::string::npos);
  EXPECT_NE(err("[\"python3\", \"-c\", \"print(1)\"]").find("printed 1 numbers for 2 completions"), std::string::npos);
  EXPECT_NE(err("[\"python3\", \"-c\", \"print('x'); print(2)\"]").find("output line 1 is not a number: 'x'"),
            std::string::npos);
  EXPECT_NE(err("[\"sleep\", \"30\"]", "timeout_s = 1.0\n").find("did not finish within 1 s"), std::string::npos);
}

}  // namespace
}  // namespace mgrl::rl
