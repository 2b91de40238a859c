// test_rewards.cpp: the reward functions on hand-written cases, the code_exec sandbox against hostile
// completions (each contained, the process going on), and command rewards' failures.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "io/config.h"
#include "io/config_schema.h"
#include "rl/rewards/rewards.h"
#include "rl/rewards/sandbox.h"
#include "rl/rewards/verdict.h"
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

// The reward-hacking hunt of 2026-11-29 (each row scored 1 before): the last number is a whole number token, or
// nothing when the last one is a piece of a larger expression; numbers are compared exactly when integers, commas
// only as thousands separators, and a gold that is not a string or number matches nothing.
TEST(Rewards, AnswerMatchIsNotGamed) {
  EXPECT_EQ(last_number("The answer is 3/4."), "");
  EXPECT_EQ(last_number("The answer is \\frac{1}{2}."), "");
  EXPECT_EQ(last_number("The answer is 2^10."), "");
  EXPECT_EQ(last_number("The answer is 2^{10}."), "");
  EXPECT_EQ(last_number("The answer is 1e3."), "1e3");
  EXPECT_EQ(last_number("The answer is 1.5e-3."), "1.5e-3");
  EXPECT_EQ(last_number("x = 5-3, so the answer is x=5-3"), "");
  EXPECT_EQ(last_number("The answer is .5"), ".5");
  EXPECT_EQ(last_number("The answer is \xE2\x88\x92" "5."), "-5");
  EXPECT_EQ(last_number("The answer is 0x10."), "");
  EXPECT_EQ(last_number("The answer is 1.2.3"), "");
  EXPECT_EQ(last_number("The answers are 1,2"), "2");
  EXPECT_EQ(last_number("so \\boxed{42}."), "42");
  EXPECT_EQ(last_number("costs $1,000,000 in all"), "1000000");
  EXPECT_EQ(last_number("x = -7"), "-7");
  const Rewards num = make("[[reward]]\nkind = \"answer_match\"\n");
  const auto at = [&](const Rewards& r, const std::string& completion, const nlohmann::json& gold) {
    return score1(r, {completion}, {{"answer", gold}})[0];
  };
  EXPECT_EQ(at(num, "The answer is 1234568.", 1234567), 0);
  EXPECT_EQ(at(num, "The answer is 1000000999.", 1000000000), 0);
  EXPECT_EQ(at(num, "The answer is 1234567.5", 1234567), 0);  // would cover 1234567 and 1234568
  EXPECT_EQ(at(num, "The answer is 0.000001.", 0), 0);
  EXPECT_EQ(at(num, "The answer is 3/4.", 4), 0);
  EXPECT_EQ(at(num, "The answer is 1e3.", 3), 0);
  EXPECT_EQ(at(num, "The answer is 1e3.", 1000), 1);
  EXPECT_EQ(at(num, "The answer is .5", 5), 0);
  EXPECT_EQ(at(num, "The answer is .5", 0.5), 1);
  EXPECT_EQ(at(num, "The answer is \xE2\x88\x92" "5.", 5), 0);
  EXPECT_EQ(at(num, "The answer is \xE2\x88\x92" "5.", -5), 1);
  EXPECT_EQ(at(num, "The answers are 1,2", 12), 0);
  EXPECT_EQ(at(num, "The answer is 12345678901234567891.", "12345678901234567890"), 0);  // beyond doubles' integers
  EXPECT_EQ(at(num, "The answer is 12345678901234567890.", "12,345,678,901,234,567,890"), 1);
  EXPECT_EQ(at(num, "The answer is -0", 0), 1);
  EXPECT_EQ(at(num, "The answer is 0.3333333", "0.333333"), 1);  // within 1e-6 relative of a non-integer gold
  const Rewards boxed = make("[[reward]]\nkind = \"answer_match\"\nextract = \"boxed\"\n");
  EXPECT_EQ(at(boxed, "\\boxed{999999}", 1000000), 0);
  EXPECT_EQ(at(boxed, "\\boxed{1,2,3}", 123), 0);
  EXPECT_EQ(at(boxed, "\\boxed{,,5,,}", 5), 0);
  EXPECT_EQ(at(boxed, "\\boxed{0x10}", 16), 0);
  EXPECT_EQ(at(boxed, "\\boxed{1,000}", 1000), 1);
  const Rewards str = make("[[reward]]\nkind = \"answer_match\"\nextract = \"regex\"\npattern = \"<a>(.*?)</a>\"\n"
                           "compare = \"string\"\n");
  EXPECT_EQ(at(str, "<a>null</a>", nullptr), 0);
  EXPECT_EQ(at(str, "<a>true</a>", true), 0);
  EXPECT_EQ(at(str, "<a>[\"3\",\"4\"]</a>", nlohmann::json::array({"3", "4"})), 0);
  EXPECT_EQ(at(str, "<a> </a>", " "), 0);
  EXPECT_EQ(at(str, "<a>7</a>", 7), 1);
  // A gold that is no string or number makes the line unusable (said at start-up, an error when every line is).
  const nlohmann::json null_row = {{"answer", nullptr}};
  std::string msg;
  try {
    str.check_data({&null_row}, {1}, "d.jsonl");
  } catch (const UserError& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("column 'answer' is null, not a string or a number"), std::string::npos) << msg;
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
  // open-r1's format reward: re.match(r"^<think>.*?</think>\s*<answer>.*?</answer>$", c, DOTALL | MULTILINE). Matched
  // anywhere, '^' matches after junk's newline; match_start anchors it as re.match does ('$' still at a line end).
  const std::string pat = "pattern = \"^<think>.*?</think>\\\\s*<answer>.*?</answer>$\"\n";
  const Rewards anywhere = make("[[reward]]\nkind = \"regex\"\n" + pat);
  const Rewards start = make("[[reward]]\nkind = \"regex\"\n" + pat + "match_start = true\n");
  const std::vector<std::string> cs = {"junk\n<think>x</think><answer>5</answer>\njunk",
                                       "<think>x</think><answer>5</answer>\njunk", "<think>x</think> <answer>5</answer>"};
  EXPECT_EQ(score1(anywhere, cs, row), (std::vector<double>{1, 1, 1}));
  EXPECT_EQ(score1(start, cs, row), (std::vector<double>{0, 1, 1}));
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

// A completion must not reach or fake the verdict (docs/rewards.md, "What a code_exec score guarantees"): each of
// these scores 0 and leaves no process and no file behind. Each tries to find the harness's secrets (frames, gc,
// files, /proc, environment), to pass without a right value (objects equal to everything, patched builtins and
// modules, fake markers, early exits) or to act after the solution returned (threads, children).
TEST(Rewards, VerdictCannotBeFaked) {
  // Sandboxes go to a directory of this test's own: afterwards it must be empty, and no process may run in it.
  const std::string tmp = test::temp_path("verdict_tmp_" + std::to_string(::getpid()));
  std::filesystem::create_directories(tmp);
  const char* old_tmp = std::getenv("TMPDIR");
  const std::string saved = old_tmp ? old_tmp : "";
  ::setenv("TMPDIR", tmp.c_str(), 1);
  const Rewards r = make("[[reward]]\nkind = \"code_exec\"\ntimeout_s = 3.0\ncpu_s = 2\nmemory_mb = 512\n");
  const nlohmann::json row = {{"tests", {"assert f(2) == 4", "assert f(3) == 9"}}};
  auto block = [](const std::string& code) { return "Here:\n```python\n" + code + "\n```\n"; };
  // _spray writes pass markers carrying a found secret (or, without one, text that looks like a verdict) to every
  // descriptor it can; _fake does so and leaves with status 0.
  const std::string fake = R"PY(import os, re, sys
def _spray(nonce):
    s = 'ok\nPASS\ntrue\n{"verdict": "pass"}\n1.0\n'
    if nonce:
        s += ''.join('\n%s ok %d\n' % (nonce, i) for i in range(10)) + '\n%s done\n' % nonce
    for fd in range(1, 10):
        try:
            os.write(fd, s.encode())
        except OSError:
            pass
def _fake(nonce):
    _spray(nonce)
    os._exit(0)
SECRET = re.compile('MGRL[0-9a-f]{32}')
)PY";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"frames", fake + R"PY(
fr = sys._getframe()
while fr is not None:
    for v in list(fr.f_locals.values()) + list(fr.f_globals.values()):
        if isinstance(v, str) and SECRET.fullmatch(v):
            _fake(v)
    fr = fr.f_back
_fake(None))PY"},
      {"gc", fake + R"PY(
import gc
for o in gc.get_objects():
    c = getattr(o, '__code__', None)
    for k in (c.co_consts if c is not None else ()):
        if isinstance(k, str) and SECRET.fullmatch(k):
            _fake(k)
_fake(None))PY"},
      {"files and /proc", fake + R"PY(
def scan(path):
    try:
        with open(path, 'rb') as fh:
            m = re.search(rb'MGRL[0-9a-f]{32}', fh.read(1 << 20))
        if m:
            _fake(m.group().decode())
    except OSError:
        pass
for name in os.listdir('.'):
    scan(name)
pp = os.getppid()
for p in ('/proc/self/cmdline', '/proc/self/environ', '/proc/%d/cmdline' % pp, '/proc/%d/environ' % pp):
    scan(p)
for d in ('/proc/self/fd', '/proc/%d/fd' % pp):
    try:
        os.listdir(d)
    except OSError:
        pass
_fake(None))PY"},
      {"environment", fake + R"PY(
for k, v in os.environ.items():
    m = SECRET.search(k + '=' + v)
    if m:
        _fake(m.group())
_fake(None))PY"},
      {"writes result-like files", "for n in ('result.json', 'verdict', 'main.py', 'PASS'):\n"
                                   "    open(n, 'a').write('true\\nPASS\\n')\ndef f(x):\n    return 0"},
      {"os._exit(0) early", "import os\nos._exit(0)"},
      {"sys.exit(0) early", "import sys\nsys.exit(0)"},
      {"os._exit(0) in the test", "def f(x):\n    import os\n    os._exit(0)"},
      {"exception as verdict", "def f(x):\n    raise SystemExit(0)"},
      {"equal to everything", "class A:\n    def __eq__(self, o):\n        return True\n    def __ne__(self, o):\n"
                              "        return False\n    def __bool__(self):\n        return True\n    __hash__ = object.__hash__\n"
                              "def f(x):\n    return A()"},
      {"int subclass", "class I(int):\n    def __eq__(self, o):\n        return True\n    __hash__ = int.__hash__\n"
                       "def f(x):\n    return I(0)"},
      {"patched exec", "import builtins\nbuiltins.exec = lambda *a, **k: None\nbuiltins.eval = lambda *a, **k: None\n"
                       "def f(x):\n    return 0"},
      {"patched isinstance, type, operator.eq, unittest", "import builtins, operator, unittest\n"
                                                  "builtins.isinstance = lambda *a: True\nbuiltins.type = lambda *a: int\n"
                                                  "operator.eq = lambda a, b: True\n"
                                                  "unittest.TestCase.assertEqual = lambda *a, **k: None\n"
                                                  "def f(x):\n    return 0"},
      {"patched json", "import json\njson.dumps = lambda *a, **k: 'true'\njson.dump = lambda o, fp, **k: fp.write('true')\n"
                       "json.loads = lambda *a, **k: True\ndef f(x):\n    return 0"},
      {"fake markers on stdout and stderr", "import sys, atexit\nfor s in (sys.stdout, sys.stderr):\n"
                                            "    s.write('\\nMGRL00000000000000000000000000000000 ok 0\\nok\\nPASS\\ntrue\\n')\n"
                                            "    s.flush()\natexit.register(lambda: print('true\\nPASS'))\n"
                                            "def f(x):\n    print('{\"verdict\": \"pass\"}')\n    return 0"},
      {"thread after the solution", fake + R"PY(
import gc, threading, time
def spam():
    while True:
        nonce = None
        for o in gc.get_objects():
            c = getattr(o, '__code__', None)
            for k in (c.co_consts if c is not None else ()):
                if isinstance(k, str) and SECRET.fullmatch(k):
                    nonce = k
        _spray(nonce)
        time.sleep(0.002)
threading.Thread(target=spam, daemon=True).start()
time.sleep(0.1)
def f(x):
    return 0)PY"},
      {"child process after the solution", fake + R"PY(
import time
if os.fork() == 0:
    os.setsid()
    nonce = None
    try:
        m = SECRET.search(open('main.py').read())
        nonce = m.group() if m else None
    except OSError:
        pass
    for _ in range(400):
        _spray(nonce)
        time.sleep(0.005)
    os._exit(0)
time.sleep(0.2)
def f(x):
    return 0)PY"},
  };
  std::vector<std::string> completions;
  for (const auto& c : cases) completions.push_back(block(c.second));
  if (sandbox_support().namespaces)  // without a PID namespace its parent is this process
    completions.push_back(block("import os\nos.kill(os.getppid(), 9)\ndef f(x):\n    return 0"));
  completions.push_back(block("def f(x):\n    return x * x"));  // and an honest one, scored among them
  const auto got = score1(r, completions, row);
  for (std::size_t i = 0; i < cases.size(); ++i) EXPECT_EQ(got[i], 0.0) << cases[i].first;
  if (sandbox_support().namespaces) {
    EXPECT_EQ(got[cases.size()], 0.0) << "kills its parent";
  }
  EXPECT_EQ(got.back(), 1.0) << "the honest solution";
  // Nothing left: no process whose working directory lies in `tmp`, no file in it.
  ::usleep(300 * 1000);
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    std::error_code ec;
    const auto cwd = std::filesystem::read_symlink(e.path() / "cwd", ec).string();
    EXPECT_TRUE(ec || cwd.rfind(tmp, 0) != 0) << "process " << e.path() << " left in " << cwd;
  }
  EXPECT_TRUE(std::filesystem::is_empty(tmp)) << tmp;
  if (old_tmp) ::setenv("TMPDIR", saved.c_str(), 1);
  else ::unsetenv("TMPDIR");
  std::filesystem::remove_all(tmp);
}

// The expected values stay out of the sandbox's sight: with a root of its own, a data file elsewhere (here in GTest's
// temporary directory) cannot be read, and neither can the home, working and data directories of the machine.
TEST(Rewards, SandboxSeesOnlyTheSystem) {
  if (!sandbox_support().own_root) GTEST_SKIP() << "no root of its own here: " << sandbox_support().describe();
  const std::string data = test::write_temp("secret_tests.jsonl", "{\"tests\": [\"assert f(7) == 123457\"]}\n");
  const Rewards r = make("[[reward]]\nkind = \"code_exec\"\n");
  const nlohmann::json row = {{"tests", {"assert f(7) == 123457"}}};
  auto block = [](const std::string& code) { return "```python\n" + code + "\n```\n"; };
  const std::string src = std::filesystem::path(__FILE__).parent_path().string();  // the machine's files
  const auto got = score1(r, {block("import re\ndef f(x):\n    return int(re.search(r'== (\\d+)', open('" + data +
                                    "').read()).group(1))"),
                              block("import os\ndef f(x):\n    return 123457 if os.path.exists('" + src + "') else 0"),
                              block("import os\ndef f(x):\n    return 123457 if {'home', 'work', 'var', 'srv', 'mnt', "
                                    "'boot'} & set(os.listdir('/')) else 0"),
                              block("import os\ndef f(x):\n    return 123457 if os.access('/', os.W_OK) and "
                                    "open('/x', 'w') else 0"),
                              block("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\ndef f(x):\n"
                                    "    return 123457 if libc.mount(None, b'/usr', None, 32 | 4096, None) == 0 else 0"),
                              block("def f(x):\n    return 123457")},
                          row);
  EXPECT_EQ(got, (std::vector<double>{0, 0, 0, 0, 0, 1}));  // remounting /usr writable fails too
}

// What mgrl compares is Python's == on plain values, evaluated by mgrl on what the child reports.
TEST(Rewards, VerdictComparesLikePython) {
  auto eq = [](const std::string& a, const std::string& b) {
    nlohmann::json x, y;
    EXPECT_TRUE(parse_report(a, &x)) << a;
    EXPECT_TRUE(parse_report(b, &y)) << b;
    return py_equal(x, y);
  };
  EXPECT_TRUE(eq(R"({"int":"4"})", R"({"float":"4.0"})"));
  EXPECT_TRUE(eq("true", R"({"int":"1"})"));
  EXPECT_TRUE(eq(R"({"int":"123456789012345678901234567890"})", R"({"int":"123456789012345678901234567890"})"));
  EXPECT_FALSE(eq(R"({"int":"9007199254740993"})", R"({"float":"9007199254740992.0"})"));  // exact, as Python
  EXPECT_FALSE(eq(R"({"float":"nan"})", R"({"float":"nan"})"));
  EXPECT_FALSE(eq(R"({"list":[{"int":"1"}]})", R"({"tuple":[{"int":"1"}]})"));
  EXPECT_TRUE(eq(R"({"set":[{"int":"1"},{"int":"2"}]})", R"({"frozenset":[{"int":"2"},{"int":"1"}]})"));
  EXPECT_TRUE(eq(R"({"dict":[["a",{"int":"1"}],["b",null]]})", R"({"dict":[["b",null],["a",{"float":"1.0"}]]})"));
  EXPECT_FALSE(eq(R"({"dict":[["a",{"int":"1"}],["a",{"int":"1"}]]})", R"({"dict":[["a",{"int":"1"}],["b",{"int":"1"}]]})"));
  EXPECT_FALSE(eq(R"("4")", R"({"int":"4"})"));
  EXPECT_FALSE(eq(R"({"int":"4","x":1})", R"({"int":"4"})"));  // not a tagged value
  EXPECT_FALSE(eq(R"({"object":"A"})", R"({"object":"A"})"));
  nlohmann::json v;
  EXPECT_FALSE(parse_report(R"({"int":"4"} {"int":"4"})", &v));  // one document only
  EXPECT_FALSE(parse_report("PASS\n" R"({"int":"4"})", &v));
  EXPECT_FALSE(parse_report(std::string(1000, '[') + std::string(1000, ']'), &v));  // nested too deep
}

// The forms of tests mgrl checks, Python's semantics on them, the failure of every other form, and the cost.
TEST(Rewards, VerdictSupportedForms) {
  const Rewards r = make("[[reward]]\nkind = \"code_exec\"\ntimeout_s = 10.0\n");
  const nlohmann::json row = {
      {"test_setup_code", "import math"},
      {"tests",
       {"assert f(2) == 4, 'f(2) is 4'", "assert 9 == f(3)", "assert math.isclose(f(0.5), 0.25, rel_tol=1e-9)",
        "assert g() == (1, [2.0, 'a'], {'k': {3, 4}}, None, True)", "assert set(h()) == set([1, 2])",
        "assert f(2)"}}};
  auto block = [](const std::string& code) { return "```python\n" + code + "\n```\n"; };
  const std::string g = "def g():\n    return (1.0, [2, 'a'], {'k': frozenset([4, 3])}, None, 1)\n"
                        "def h():\n    return [2, 1, 2]\n";
  const auto got = score1(r, {block("def f(x):\n    print('noise ' * 1000)\n    return x * x\n" + g),
                              block("def f(x):\n    return float(x * x)\n" + g),
                              block("def f(x):\n    return x * x\ndef g():\n    return [1, [2, 'a'], {'k': {3, 4}}, None, True]\n"
                                    "def h():\n    return (1, 2)\n"),
                              block("def f(x):\n    return x + x\n" + g)},
                          row);
  // The last test (a truth value) is never checked: 5 of 6 at best.
  EXPECT_DOUBLE_EQ(got[0], 5.0 / 6);
  EXPECT_DOUBLE_EQ(got[1], 5.0 / 6);
  EXPECT_DOUBLE_EQ(got[2], 4.0 / 6);  // a list is not the tuple the test wants
  EXPECT_DOUBLE_EQ(got[3], 3.0 / 6);  // f(2) == 4 by chance, and g, h
  // A completion cut in the middle of a character (invalid UTF-8) is scored, not thrown on (it was: nlohmann's dump
  // threw in a worker thread, which ended the process).
  const nlohmann::json sq = {{"tests", {"assert f(2) == 4"}}};
  EXPECT_EQ(score1(r, {block("def f(x):\n    return x * x  # \xc3"), block("def f(x):\n    return '\xff'")}, sq),
            (std::vector<double>{1.0, 0.0}));
  // Cost: one interpreter per test.
  const nlohmann::json three = {{"tests", {"assert f(1) == 1", "assert f(2) == 4", "assert f(3) == 9"}}};
  std::vector<std::string> many(8, block("def f(x):\n    return x * x"));
  score1(r, {many[0]}, three);  // plans the tests once
  const auto t0 = std::chrono::steady_clock::now();
  const auto all = score1(r, many, three);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  for (double x : all) EXPECT_EQ(x, 1.0);
  std::printf("code_exec: %.1f ms per test (8 completions x 3 tests, 2 threads: %.0f ms)\n", ms * 2 / 24, ms);
}

TEST(Rewards, CommandProtocolAndFailures) {
  const std::string judge = test::write_temp("judge.py",
                                             "import sys, json\nfor l in sys.stdin:\n    j = json.loads(l)\n"
                                             "    print(1.0 if j['completion'] == j['answer'] else 0.25)\n");
  const nlohmann::json row = {{"answer", "ok"}};
  const Rewards r = make("[[reward]]\nkind = \"command\"\nname = \"judge\"\ncommand = [\"python3\", \"" + judge + "\"]\n");
  EXPECT_EQ(score1(r, {"ok", "no", "ok"}, row), (std::vector<double>{1.0, 0.25, 1.0}));
  // A completion that is not valid UTF-8 (cut inside a character) reaches the program with U+FFFD in place of the
  // bad bytes; it threw in nlohmann's dump before.
  const std::string echo = test::write_temp("echo_len.py",
                                            "import sys, json\nfor l in sys.stdin:\n    c = json.loads(l)['completion']\n"
                                            "    print(1.0 if c == 'ok\\ufffd' else 0.0)\n");
  const Rewards e = make("[[reward]]\nkind = \"command\"\nname = \"echo\"\ncommand = [\"python3\", \"" + echo + "\"]\n");
  EXPECT_EQ(score1(e, {"ok\xc3", "ok"}, row), (std::vector<double>{1.0, 0.0}));
  // U+2028 / U+2029 in a completion reach a judge that splits its input with str.splitlines() inside one line (sent
  // escaped; raw, they cut the line and the judge failed, ending the run: the reward-hacking hunt of 2026-11-29).
  const std::string split = test::write_temp("splitlines.py",
                                             "import sys, json\nfor l in sys.stdin.read().splitlines():\n"
                                             "    print(float(len(json.loads(l)['completion'])))\n");
  const Rewards sp = make("[[reward]]\nkind = \"command\"\nname = \"split\"\ncommand = [\"python3\", \"" + split + "\"]\n");
  EXPECT_EQ(score1(sp, {"4\xE2\x80\xA8" "3", "a\xE2\x80\xA9" "b\xE2\x80\xA8", "x"}, row),
            (std::vector<double>{3.0, 4.0, 1.0}));
  auto err = [&](const std::string& cmd, const std::string& extra = "") {
    const Rewards c = make("[[reward]]\nkind = \"command\"\nname = \"j\"\ncommand = " + cmd + "\n" + extra);
    return test::error_of([&] { score1(c, {"a", "b"}, row); });
  };
  EXPECT_NE(err("\"/no/such/judge\"").find("reward 'j' (command [\"/no/such/judge\"]): cannot run it"), std::string::npos);
  EXPECT_NE(err("[\"python3\", \"-c\", \"import sys; sys.exit(3)\"]").find("exited with status 3"), std::string::npos);
  EXPECT_NE(err("[\"python3\", \"-c\", \"print(1)\"]").find("printed 1 numbers for 2 completions"), std::string::npos);
  EXPECT_NE(err("[\"python3\", \"-c\", \"print('x'); print(2)\"]")
                .find("output line 1 is not a number (nor null for no value): 'x'"),
            std::string::npos);
  EXPECT_NE(err("[\"python3\", \"-c\", \"print('inf'); print(2)\"]").find("output line 1 is not a number"),
            std::string::npos);
  // null (None, nan): no value for that completion (trl's reward function returning None); the total is the
  // nansum of the weighted values, NaN where no function gave one.
  const Rewards nul = make("[[reward]]\nkind = \"command\"\nname = \"j\"\ncommand = [\"python3\", \"-c\", "
                           "\"print('null'); print(' None ')\"]\n[[reward]]\nkind = \"command\"\nname = \"k\"\n"
                           "weight = 2.0\ncommand = [\"python3\", \"-c\", \"print('NaN'); print(0.25)\"]\n");
  std::vector<RewardSample> ss(2);
  for (auto& x : ss) x.row = &row, x.completion = "a", x.completion_tokens = 1, x.finish_reason = "eos";
  const auto v = nul.score(ss, ".", 1);
  ASSERT_EQ(v.size(), 2u);
  EXPECT_TRUE(std::isnan(v[0][0]) && std::isnan(v[0][1]) && std::isnan(v[1][0]));
  EXPECT_EQ(v[1][1], 0.25);
  EXPECT_TRUE(std::isnan(nul.total(v[0])));
  EXPECT_EQ(nul.total(v[1]), 0.5);
  EXPECT_NE(err("[\"sleep\", \"30\"]", "timeout_s = 1.0\n").find("did not finish within 1 s"), std::string::npos);
}


// How long the ranks that finish scoring first may wait for the others (rl::wait_for_rewards): the rewards' own
// limits. Functions that run no program count 0; a command runs once a batch (timeout_s, 0: 600 s); code_exec runs
// each completion's tests under timeout_s (0: 10 s) after at most 60 s of planning, `threads` completions at once.
TEST(Rewards, MaxSecondsAreTheRewardsOwnLimits) {
  EXPECT_EQ(make("[[reward]]\nkind = \"regex\"\npattern = \"a\"\n").max_seconds(100, 4), 0.0);
  EXPECT_EQ(make("[[reward]]\nkind = \"command\"\ncommand = [\"true\"]\n").max_seconds(5, 1), 600.0);
  EXPECT_EQ(make("[[reward]]\nkind = \"command\"\ncommand = [\"true\"]\ntimeout_s = 30\n").max_seconds(5, 1), 30.0);
  const Rewards code = make("[[reward]]\nkind = \"code_exec\"\ntimeout_s = 3.0\n");
  EXPECT_EQ(code.max_seconds(8, 4), 2 * (3.0 + 60.0));
  EXPECT_EQ(code.max_seconds(9, 4), 3 * (3.0 + 60.0));
  EXPECT_EQ(code.max_seconds(0, 4), 0.0);
  EXPECT_EQ(make("[[reward]]\nkind = \"code_exec\"\n").max_seconds(1, 0), 10.0 + 60.0);  // threads < 1: one at a time
  // The sum over the functions (they run one after another).
  EXPECT_EQ(make("[[reward]]\nkind = \"command\"\ncommand = [\"true\"]\ntimeout_s = 30\n"
                 "[[reward]]\nkind = \"code_exec\"\ntimeout_s = 3.0\n[[reward]]\nkind = \"regex\"\npattern = \"a\"\n")
                .max_seconds(4, 4),
            30.0 + 63.0);
}

}  // namespace
}  // namespace mgrl::rl
