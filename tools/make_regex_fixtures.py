#!/usr/bin/env python3
"""make_regex_fixtures.py: what the Hugging Face tokenizers library's regexes (Oniguruma, Ruby syntax) match, for
unit.tokenizer's Regex tests (mgrl compiles tokenizer.json patterns with PCRE2 after translating them).

  classes: patterns that match one character each (\\w, \\p{Han}, [^\\S\\n], class intersections, nested classes,
           POSIX brackets, ...), swept over every code point below U+32000 and U+E0000-U+E01EF: the matched code
           points as [first, last] ranges.
  spans:   whole patterns (the pre-tokenizer patterns of GPT-2, Llama 3, Qwen2, Kimi K2 and BLOOM; anchors, word
           boundaries, option groups) on texts: the non-empty matches as [begin, end) byte offsets.

The matches come from tokenizers' own Split pre-tokenizer (behaviour "isolated": matches and gaps; "removed": gaps
only; so matches = isolated minus removed).
    /work/venv-fixtures/bin/python tools/make_regex_fixtures.py     (writes tests/data/tokenizers/regex_onig.json)"""
import json
import os

import tokenizers
from tokenizers import Regex
from tokenizers import pre_tokenizers as pt

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")

KIMI = ("[\\p{Han}]+|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*"
        "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?"
        "[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*"
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
GPT2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
LLAMA3 = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
          "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
QWEN2 = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
         "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
BLOOM = " ?[^(\\s|[.,!?…。,、।۔،])]+"

CLASSES = [
    r"\w", r"\W", r"\s", r"\S", r"\d", r"\D", r"\h", r"\H",
    r"\p{Han}", r"\p{Hiragana}", r"\p{Katakana}", r"\p{Latin}", r"\p{Greek}", r"\p{Cyrillic}", r"\p{Arabic}",
    r"\p{Devanagari}", r"\p{Common}", r"\p{Inherited}", r"\P{Han}", r"\p{^Han}", r"[\p{Han}\p{Hiragana}]",
    r"\p{L}", r"\p{Lu}", r"\p{N}", r"\p{M}", r"\p{P}", r"\p{S}", r"\p{Alphabetic}", r"\p{Word}",
    r"[[:alpha:]]", r"[[:alnum:]]", r"[[:punct:]]", r"[[:space:]]", r"[[:digit:]]", r"[[:upper:]]", r"[[:lower:]]",
    r"[[:word:]]", r"[[:^alpha:]]",
    r"[^\S\n]", r"[^\S\r\n]", r"[^\s\p{L}\p{N}]", r"[^\r\n\p{L}\p{N}]", r"[\W\d]", r"[^\W]", r"[\H]", r"[^\h\s]",
    r"[\w&&[^\d]]", r"[\p{L}&&[^\p{Han}]]", r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]",
    r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]", r"[[ab]c]", r"[^[ab]c]", r"[^(\s|[.,!?…。,、।۔،])]",
    r"[a-z&&[^aeiou]]", r"[^a-z&&[^aeiou]]", r"[a-z&&[^aeiou]&&[^l-n]]", r"[^[^a-c][^b-d]]", r"[ab&&bc[c]]",
    r"[\u0041-\u005A]", r"\u00E9",
]

TEXTS = [
    "Hello world! It's 2026, isn't it? I'll say: 12345 apples.\n\n  Indented line\ttab\r\nCRLF  ",
    "你好，世界。日本語のテキスト、カタカナ。한국어 텍스트",
    "Ünïcödé façade naïve Ⅻ ½ x² ①②③ ١٢٣ ٤٥",
    "emoji ❤️ 👍🏽 family 👨‍👩‍👧 flags 🇩🇪 end",
    "mixed\u00a0nbsp\u2003em\u3000ideo\u180emvs\u200bzw\u0085nel",
    "Hello, world. Bonjour... ¿Qué? ¡Sí! «quotes» „low“ 'single' \"double\"",
    "CAPS lower MiXeD McDonald's O'NEIL'S SHOUTING'LL",
    "line1\nline2\n\n\nline5\n",
    "tab\there  \n  \t trailing   ",
    "क्षत्रिय हिन्दी ।  اَلْعَرَبِيَّةُ ۔ ،",
    "",
]

SPAN_PATTERNS = [
    GPT2, LLAMA3, QWEN2, KIMI, BLOOM,
    r"\s+$", r"^\s+", r"$", r"^", r"^\w+$", r"\A\s+", r"\s+\z", r"\bx", r"\b\w", r"\B\w+", r"\w+\b",
    r"(?m)a.b", r"a.b", r"(?i)hello", r"(?i:caps)", r"(?x) a b ", r"\u0041+", r"[^\S\n]+",
]
SPAN_TEXTS = TEXTS + ["a\nb a b", "x\n\n\ny", "\n\nx", "❤️x ax x", "AAB", "a b ab", "^$ ^", "aaa\n"]


# mgrl's PCRE2 (10.42, Debian 12) has Unicode 14's tables, the library's Oniguruma Unicode 16's. Characters assigned
# since are left out by the test (PCRE2 calls them unassigned, \p{Cn}); these Unicode 14 characters had their
# Alphabetic or Lowercase property changed by Unicode 16 (found by this fixture's test), so they are not compared.
CHANGED_SINCE_UNICODE_14 = [0x363, 0x364, 0x365, 0x366, 0x367, 0x368, 0x369, 0x36a, 0x36b, 0x36c, 0x36d, 0x36e, 0x36f,
                            0xc04, 0xf82, 0xf83, 0x10fc, 0x1dd3, 0x1dd4, 0x1dd5, 0x1dd6, 0x1dd7, 0x1dd8, 0x1dd9,
                            0x1dda, 0x1ddb, 0x1ddc, 0x1ddd, 0x1dde, 0x1ddf, 0x1de0, 0x1de1, 0x1de2, 0x1de3, 0x1de4,
                            0x1de5, 0x1de6, 0xa7f2, 0xa7f3, 0xa7f4, 0xab69, 0x11080, 0x11081]


def matches(pattern, text):
    """Non-empty matches of pattern in text, as [begin, end) character offsets."""
    iso = pt.Split(Regex(pattern), behavior="isolated").pre_tokenize_str(text)
    gaps = {tuple(o) for _, o in pt.Split(Regex(pattern), behavior="removed").pre_tokenize_str(text)}
    return [tuple(o) for _, o in iso if tuple(o) not in gaps]


def sweep_points():
    return [c for c in list(range(0, 0x32000)) + list(range(0xE0000, 0xE01F0)) if not 0xD800 <= c <= 0xDFFF]


def main():
    points = sweep_points()
    text = "".join(map(chr, points))
    classes = []
    for p in CLASSES:
        ranges = []
        for b, e in matches(p, text):
            for k in range(b, e):
                c = points[k]
                if ranges and ranges[-1][1] + 1 == c:
                    ranges[-1][1] = c
                else:
                    ranges.append([c, c])
        classes.append({"pattern": p, "ranges": ranges})
    spans = []
    for p in SPAN_PATTERNS:
        for t in SPAN_TEXTS:
            byte = [len(t[:k].encode("utf-8")) for k in range(len(t) + 1)]
            spans.append({"pattern": p, "text": t, "spans": [[byte[b], byte[e]] for b, e in matches(p, t)]})
    out = {"tokenizers": tokenizers.__version__, "sweep": [[0, 0x31FFF], [0xE0000, 0xE01EF]],
           "not_compared": CHANGED_SINCE_UNICODE_14, "classes": classes,
           "spans": spans}
    with open(os.path.join(root, "tests", "data", "tokenizers", "regex_onig.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(len(classes), "classes,", len(spans), "span cases")


if __name__ == "__main__":
    main()
