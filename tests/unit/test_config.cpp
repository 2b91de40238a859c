// test_config.cpp: the configuration reader against its own small schemas and mgrl's schema.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "core/error.h"
#include "io/config.h"
#include "io/config_schema.h"
#include "tests/unit/test_util.h"

namespace mgrl::io {
namespace {

const Schema& test_schema() {
  using T = ValueType;
  static const Schema s{
      {"mode", T::String, std::nullopt, "mode", {"train", "eval"}, {}, {}, {}},
      {"model.path", T::String, std::nullopt, "model directory", {}, {}, {}, {"train"}},
      {"model.kind", T::String, Value(std::string("llama")), "arch", {"llama", "qwen2"}, {}, {}, {}},
      {"train.steps", T::Int, Value(std::int64_t{10}), "steps", {}, 1.0, 1000.0, {}},
      {"train.lr", T::Float, Value(1e-4), "learning rate", {}, 0.0, {}, {}},
      {"train.shuffle", T::Bool, Value(true), "shuffle", {}, {}, {}, {}},
      {"lora.targets", T::StringList, Value(std::vector<std::string>{"q_proj", "v_proj"}), "modules", {}, {}, {}, {}},
  };
  return s;
}



TEST(Config, DefaultsWhenNothingGiven) {
  const auto c = Config::load(test_schema(), "", {}, "eval");
  EXPECT_EQ(c.get_string("mode"), "eval");
  EXPECT_EQ(c.get_string("model.kind"), "llama");
  EXPECT_EQ(c.get_int("train.steps"), 10);
  EXPECT_DOUBLE_EQ(c.get_float("train.lr"), 1e-4);
  EXPECT_TRUE(c.get_bool("train.shuffle"));
  EXPECT_EQ(c.get_strings("lora.targets"), (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_EQ(c.origin("train.steps").kind, Origin::Default);
  EXPECT_FALSE(c.is_set("model.path"));
}

TEST(Config, FileValuesAndOrigins) {
  const auto path = test::write_temp("good.toml",
                               "mode = \"train\"\n[model]\npath = \"/m\"\nkind = \"qwen2\"\n[train]\nsteps = 42\nlr = 3\n"
                               "shuffle = false\n[lora]\ntargets = [\"o_proj\"]\n");
  const auto c = Config::load(test_schema(), path, {});
  EXPECT_EQ(c.get_string("model.path"), "/m");
  EXPECT_EQ(c.get_string("model.kind"), "qwen2");
  EXPECT_EQ(c.get_int("train.steps"), 42);
  EXPECT_DOUBLE_EQ(c.get_float("train.lr"), 3.0);  // an integer is accepted where a number is expected
  EXPECT_FALSE(c.get_bool("train.shuffle"));
  EXPECT_EQ(c.get_strings("lora.targets"), std::vector<std::string>{"o_proj"});
  EXPECT_EQ(c.origin("train.steps").kind, Origin::File);
  EXPECT_EQ(c.origin("train.steps").line, 6);
}

TEST(Config, CommandLineOverridesFile) {
  const auto path = test::write_temp("over.toml", "mode = \"train\"\n[model]\npath = \"/m\"\n[train]\nsteps = 42\n");
  const auto c = Config::load(test_schema(), path,
                              {"--train.steps=7", "--train.lr=2.5e-5", "--train.shuffle=false", "--model.path=\"/x y\"",
                               "--lora.targets=a,b,c", "--model.kind=qwen2"},
                              "eval");
  EXPECT_EQ(c.get_int("train.steps"), 7);
  EXPECT_DOUBLE_EQ(c.get_float("train.lr"), 2.5e-5);
  EXPECT_FALSE(c.get_bool("train.shuffle"));
  EXPECT_EQ(c.get_string("model.path"), "/x y");
  EXPECT_EQ(c.get_strings("lora.targets"), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(c.get_string("mode"), "eval");  // the command line's mode wins over the file's
  EXPECT_EQ(c.origin("train.steps").kind, Origin::CommandLine);
  const auto d = Config::load(test_schema(), "", {"--lora.targets=[\"x\", \"y\"]"}, "eval");
  EXPECT_EQ(d.get_strings("lora.targets"), (std::vector<std::string>{"x", "y"}));
}

TEST(Config, UnknownKeyNamesKeyLineAndClosestKey) {
  const auto path = test::write_temp("unknown.toml", "mode = \"eval\"\n\n[train]\nstep = 3\n");
  const auto msg = test::error_of([&] { Config::load(test_schema(), path, {}); });
  EXPECT_NE(msg.find("unknown.toml:4: unknown key 'train.step' (did you mean 'train.steps'?)"), std::string::npos) << msg;
  // The same key in the wrong section.
  const auto path2 = test::write_temp("section.toml", "mode = \"eval\"\n[model]\nsteps = 3\n");
  const auto msg2 = test::error_of([&] { Config::load(test_schema(), path2, {}); });
  EXPECT_NE(msg2.find("unknown key 'model.steps' (did you mean 'train.steps'?)"), std::string::npos) << msg2;
  // Nothing close: no suggestion, a pointer to help-config.
  const auto msg3 = test::error_of([&] { Config::load(test_schema(), "", {"--completely.different=1"}, "eval"); });
  EXPECT_NE(msg3.find("unknown key 'completely.different' (mgrl help-config lists every key)"), std::string::npos)
      << msg3;
}

TEST(Config, WrongTypeNamesFileLineAndExpectedType) {
  const auto path = test::write_temp("type.toml", "mode = \"eval\"\n[train]\nlr = 0.1\nsteps = \"many\"\n");
  const auto msg = test::error_of([&] { Config::load(test_schema(), path, {}); });
  EXPECT_NE(msg.find("type.toml:4: key 'train.steps' must be an integer, not a string"), std::string::npos) << msg;
  const auto path2 = test::write_temp("type2.toml", "mode = \"eval\"\n[lora]\ntargets = [\"a\", 3]\n");
  const auto msg2 = test::error_of([&] { Config::load(test_schema(), path2, {}); });
  EXPECT_NE(msg2.find("type2.toml:3: key 'lora.targets' must be a list of strings, not an array"), std::string::npos)
      << msg2;
  const auto msg3 = test::error_of([&] { Config::load(test_schema(), "", {"--train.steps=1.5"}, "eval"); });
  EXPECT_NE(msg3.find("'--train.steps=1.5': key 'train.steps' must be an integer"), std::string::npos) << msg3;
  const auto msg4 = test::error_of([&] { Config::load(test_schema(), "", {"--train.shuffle=maybe"}, "eval"); });
  EXPECT_NE(msg4.find("must be a boolean"), std::string::npos) << msg4;
}

TEST(Config, SyntaxErrorNamesLineAndColumn) {
  const auto path = test::write_temp("syntax.toml", "mode = \"eval\"\n[train]\nsteps = = 3\n");
  const auto msg = test::error_of([&] { Config::load(test_schema(), path, {}); });
  EXPECT_NE(msg.find("syntax.toml:3:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("invalid TOML"), std::string::npos) << msg;
}

TEST(Config, EmptyOverrideValues) {
  // An empty value is a value: a string becomes "" (for a key with a default: what its doc says of empty), a list
  // becomes empty; for a number it is an error that says so; for a required key it counts as missing.
  const auto c = Config::load(test_schema(), "", {"--lora.targets=", "--model.path=m"}, "eval");
  EXPECT_TRUE(c.get_strings("lora.targets").empty());
  std::string msg = test::error_of([&] { Config::load(test_schema(), "", {"--train.steps="}, "eval"); });
  EXPECT_EQ(msg, "command line: '--train.steps=': key 'train.steps' must be an integer (the value is empty)");
  msg = test::error_of([&] { Config::load(test_schema(), "", {"--model.path="}, "train"); });
  EXPECT_EQ(msg.rfind("empty value of required key 'model.path' for mode train", 0), 0u) << msg;
  msg = test::error_of([&] { Config::load(test_schema(), "", {"--model.kind="}, "eval"); });
  EXPECT_NE(msg.find("key 'model.kind' must be one of llama, qwen2 (got \"\")"), std::string::npos) << msg;
}

TEST(Config, DirectoryIsNotAConfigurationFile) {
  const std::string dir = test::temp_path("config_dir.toml");
  std::remove(dir.c_str());
  ASSERT_EQ(std::system(("mkdir -p " + dir).c_str()), 0);
  const auto msg = test::error_of([&] { Config::load(test_schema(), dir, {}, "eval"); });
  EXPECT_EQ(msg, dir + ": not a regular file (the configuration is a TOML file)");
}

TEST(Config, MissingFileIsAUserError) {
  const auto msg = test::error_of([&] { Config::load(test_schema(), "/nonexistent/x.toml", {}, "eval"); });
  EXPECT_NE(msg.find("/nonexistent/x.toml: cannot open"), std::string::npos) << msg;
}

TEST(Config, ChoicesAndBounds) {
  auto msg = test::error_of([&] { Config::load(test_schema(), "", {"--model.kind=qwen"}, "eval"); });
  EXPECT_NE(msg.find("key 'model.kind' must be one of llama, qwen2 (got \"qwen\"); did you mean \"qwen2\"?"),
            std::string::npos)
      << msg;
  msg = test::error_of([&] { Config::load(test_schema(), "", {"--train.steps=0"}, "eval"); });
  EXPECT_NE(msg.find("key 'train.steps' must be >= 1 and <= 1000 (got 0)"), std::string::npos) << msg;
  const auto path = test::write_temp("bounds.toml", "mode = \"eval\"\n[train]\nlr = -1.0\n");
  msg = test::error_of([&] { Config::load(test_schema(), path, {}); });
  EXPECT_NE(msg.find("bounds.toml:3: key 'train.lr' must be >= 0.0"), std::string::npos) << msg;
}

TEST(Config, RequiredKeysAndModes) {
  auto msg = test::error_of([&] { Config::load(test_schema(), "", {}); });
  EXPECT_NE(msg.find("no mode given"), std::string::npos) << msg;
  msg = test::error_of([&] { Config::load(test_schema(), "", {}, "train"); });
  EXPECT_NE(msg.find("missing required key 'model.path' for mode train"), std::string::npos) << msg;
  msg = test::error_of([&] { Config::load(test_schema(), "", {}, "fly"); });
  EXPECT_NE(msg.find("key 'mode' must be one of train, eval"), std::string::npos) << msg;
  // The command line alone can give every required key: no file needed.
  const auto c = Config::load(test_schema(), "", {"--model.path=/models/tiny"}, "train");
  EXPECT_EQ(c.get_string("model.path"), "/models/tiny");
}

TEST(Config, MalformedArguments) {
  auto msg = test::error_of([&] { Config::load(test_schema(), "", {"--train.steps"}, "eval"); });
  EXPECT_NE(msg.find("option '--train.steps' needs a value"), std::string::npos) << msg;
  msg = test::error_of([&] { Config::load(test_schema(), "", {"train.steps=3"}, "eval"); });
  EXPECT_NE(msg.find("unexpected argument 'train.steps=3'"), std::string::npos) << msg;
}

TEST(Config, NestedTablesAndUnknownSectionsAreRejected) {
  const auto path = test::write_temp("nested.toml", "mode = \"eval\"\n[train.inner]\nx = 1\n");
  auto msg = test::error_of([&] { Config::load(test_schema(), path, {}); });
  EXPECT_NE(msg.find("unknown key 'train.inner'"), std::string::npos) << msg;
  const auto path2 = test::write_temp("emptysec.toml", "mode = \"eval\"\n[nothing]\n");
  msg = test::error_of([&] { Config::load(test_schema(), path2, {}); });
  EXPECT_NE(msg.find("emptysec.toml:2: unknown section [nothing]"), std::string::npos) << msg;
}

TEST(Config, EffectiveConfigRoundTrips) {
  const auto c = Config::load(test_schema(), "", {"--model.path=/a \"b\"", "--train.lr=0.125", "--train.steps=5"},
                              "train");
  const auto text = c.to_toml();
  const auto d = Config::from_string(test_schema(), text, "roundtrip");
  for (const auto& k : {"mode", "model.path", "model.kind"}) EXPECT_EQ(d.get_string(k), c.get_string(k)) << k;
  EXPECT_EQ(d.get_int("train.steps"), 5);
  EXPECT_DOUBLE_EQ(d.get_float("train.lr"), 0.125);
  EXPECT_EQ(d.get_strings("lora.targets"), c.get_strings("lora.targets"));
}

// Found by fuzzing (fuzz/fuzz_config.cpp): control characters in a string (given as \u escapes in a file or raw on
// the command line) were written raw by to_toml(), which TOML forbids, so the effective configuration stored in a
// checkpoint did not load again.
TEST(Config, EffectiveConfigRoundTripsControlCharacters) {
  const std::string odd = std::string("a\x01" "b\rc\x7f d\x1f\"\\\n\te") + '\0' + "f";
  const auto path = test::write_temp("ctrl.toml", "mode = \"eval\"\n[model]\npath = \"a\\u0001b\\r\\u0000\"\n");
  const auto c = Config::load(test_schema(), path, {}, "");
  EXPECT_EQ(c.get_string("model.path"), std::string("a\x01" "b\r") + '\0');
  const auto d = Config::load(test_schema(), "", {"--model.path=" + odd}, "train");
  for (const auto* cfg : {&c, &d}) {
    const auto text = cfg->to_toml();
    Config again;
    ASSERT_NO_THROW(again = Config::from_string(test_schema(), text, "roundtrip")) << text;
    EXPECT_EQ(again.get_string("model.path"), cfg->get_string("model.path"));
    EXPECT_EQ(again.to_toml(), text);
  }
}

// Found by fuzzing: a command-line value that is not UTF-8 could not be stored as TOML; one in quotes that is no
// TOML string escaped as a TOML parser exception (an internal error, exit 1) instead of a one-line user error.
TEST(Config, OverridesThatAreNoTomlText) {
  auto msg = test::error_of([&] { Config::load(test_schema(), "", {"--model.path=ab\xff"}, "train"); });
  EXPECT_EQ(msg, "command line: the value of '--model.path' is not valid UTF-8 (byte 3)");
  msg = test::error_of([&] { Config::load(test_schema(), "", {"--model.path=\"a\"b\""}, "train"); });
  EXPECT_NE(msg.find("key 'model.path' must be a string"), std::string::npos) << msg;
  EXPECT_EQ(Config::load(test_schema(), "", {"--model.path=\"a\\u00e9\""}, "train").get_string("model.path"),
            "a\xc3\xa9");
}

TEST(Config, HelpConfigDocumentsEveryKeyAndParsesBack) {
  const auto text = help_config(mgrl_schema(), "test");
  for (const auto& ks : mgrl_schema()) {
    const auto local = ks.name.substr(ks.name.find('.') + 1);
    EXPECT_NE(text.find(ks.doc), std::string::npos) << ks.name;
    EXPECT_NE(text.find(local + " ="), std::string::npos) << ks.name;
    EXPECT_FALSE(ks.doc.empty()) << ks.name;
  }
  // It is a valid input file: its values are the defaults.
  const auto c = Config::from_string(mgrl_schema(), text, "help");
  for (const auto& ks : mgrl_schema())
    if (ks.def && ks.name.find("[].") == std::string::npos) {  // table keys are documented as a commented example
      EXPECT_EQ(c.origin(ks.name).kind, Origin::File) << ks.name;
    }
}

TEST(Config, ArraysOfTables) {
  const auto c = Config::from_string(mgrl_schema(),
                                     "mode = \"grpo\"\n[[reward]]\nkind = \"regex\"\npattern = \"a+\"\n\n[[reward]]\n"
                                     "kind = \"command\"\ncommand = \"judge.py\"\nweight = 2\n",
                                     "in.toml");
  const auto& t = c.tables("reward");
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].line, 2);
  EXPECT_EQ(t[0].get_string("pattern"), "a+");
  EXPECT_EQ(t[0].get_float("weight"), 1.0);  // default filled in
  EXPECT_FALSE(t[0].has("weight"));
  EXPECT_EQ(t[1].get_strings("command"), std::vector<std::string>{"judge.py"});  // a string is a list of one
  EXPECT_EQ(t[1].get_float("weight"), 2.0);
  EXPECT_EQ(t[1].where("weight"), "in.toml:9: ");
  EXPECT_TRUE(c.tables("nothing").empty());
  // The effective configuration keeps the tables and reads back to the same.
  const auto back = Config::from_string(mgrl_schema(), c.to_toml(), "back");
  ASSERT_EQ(back.tables("reward").size(), 2u);
  EXPECT_EQ(back.tables("reward")[1].get_strings("command"), std::vector<std::string>{"judge.py"});
  EXPECT_EQ(back.tables("reward")[0].get_string("kind"), "regex");
}

TEST(Config, ArraysOfTablesErrors) {
  auto err = [](const std::string& text) {
    return test::error_of([&] { Config::from_string(mgrl_schema(), text, "in.toml"); });
  };
  EXPECT_EQ(err("[[reward]]\nkind = \"regex\"\npatern = \"x\"\n"),
            "in.toml:3: unknown key 'reward[].patern' (did you mean 'reward[].pattern'?)");
  EXPECT_EQ(err("[reward]\nkind = \"regex\"\n"),
            "in.toml:1: 'reward' must be an array of tables: write each one as [[reward]]");
  EXPECT_EQ(err("[[reward]]\nkind = \"regexp\"\n").rfind("in.toml:2: key 'reward[].kind' must be one of", 0), 0u);
  EXPECT_EQ(err("[[reward]]\nweight = \"x\"\n"), "in.toml:2: key 'reward[].weight' must be a number, not a string");
}

TEST(Config, ClosestSuggestsOnlyNearNames) {
  EXPECT_EQ(closest("runtime.backnd", {"runtime.backend", "log.level"}), "runtime.backend");
  EXPECT_EQ(closest("xyz", {"runtime.backend", "log.level"}), "");
}

}  // namespace
}  // namespace mgrl::io
