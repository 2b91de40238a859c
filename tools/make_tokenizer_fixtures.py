#!/usr/bin/env python3
# make_tokenizer_fixtures.py: trains small tokenizers with the Hugging Face `tokenizers` library and writes
# them, with the library's own encodings and decodings of a test corpus, to tests/data/tokenizers/.
#
# Run by hand (no downloads; everything is trained here on the corpus below):
#     /work/venv-fixtures/bin/python tools/make_tokenizer_fixtures.py [--out tests/data/tokenizers]
# Needs: tokenizers (tested with 0.23.3), transformers (5.23.0) for chat.jsonl. The C++ test tests/unit/test_tokenizer.cpp compares
# src/io/tokenizer.cpp against the files written here.
#
# Fixtures (each a folder with tokenizer.json, tokenizer_config.json, cases.jsonl; chat.jsonl from
# transformers' apply_chat_template where the config has a chat template):
#   llama3_bytelevel   Llama-3 layout: Split(Llama-3 regex) + ByteLevel(use_regex=false), ignore_merges,
#                      merges as "a b" strings, specials appended after the vocab, TemplateProcessing BOS.
#   qwen2_bytelevel    Qwen2 layout: NFC normalizer, Split(Qwen2 regex) + ByteLevel, merges as [a, b]
#                      arrays, ByteLevel post-processor (no BOS), non-special added tokens.
#   gpt2_bytelevel     GPT-2 layout: ByteLevel(add_prefix_space=false, use_regex=true).
#   roberta_bytelevel  the GPT-2 model with ByteLevel(add_prefix_space=true), RobertaProcessing, <mask> lstrip.
#   splits_bytelevel   the GPT-2 model behind a normalizer/pre-tokenizer mix: NFKC, Replace, Strip, every
#                      Split behaviour, invert, Digits, BertProcessing.
#   llama2_sentencepiece  Llama-2 layout: Prepend("▁") + Replace(" ", "▁") normalizer, no pre-tokenizer,
#                      BPE with byte_fallback and fuse_unk, decoder Replace/ByteFallback/Fuse/Strip.
#   metaspace_first    the same model behind Metaspace(prepend_scheme=first, split=false), Metaspace decoder.
#   metaspace_split    the same model behind Metaspace(prepend_scheme=always, split=true).
#   sentencepiece_unk  the Llama-2 layout without byte_fallback: unknown characters become <unk> (fuse_unk).
import argparse
import json
import os
import sys

import tokenizers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")

# ---- training corpus: many scripts, emoji, code, whitespace, digits, CRLF ----
CORPUS = [
    "The quick brown fox jumps over the lazy dog. It's a sunny day, isn't it? We'll see what they've done.",
    "Machine learning models are trained on large amounts of text. Tokenizers split the text into pieces.",
    "In 2024, the company reported revenue of $1,234,567.89 and 42 new products; growth was 13.5% year over year.",
    "Hello world! Hello there, general Kenobi. You're a bold one. I'm not sure I'd agree, but she'll try.",
    "Fine-tuning with LoRA adapters keeps the base weights frozen and trains small low-rank matrices.",
    "Reinforcement learning from verifiable rewards: sample several completions, score them, compare within the group.",
    "Die Größe der Straße überrascht mich. Übermäßig schöne Bäume säumen den Weg, und die Vögel singen fröhlich.",
    "Ärger, Öl und Übung: Schüler lernen heute Mathematik, Physik und Geschichte. Grüße aus München!",
    "Καλημέρα κόσμε! Η γλώσσα είναι όμορφη και η θάλασσα είναι γαλάζια. Ευχαριστώ πολύ για τη βοήθεια.",
    "Привет, мир! Как дела? Сегодня хорошая погода, и мы идём гулять в парк. Спасибо большое!",
    "Москва — столица России. Русский язык богат и выразителен; учёные изучают его грамматику.",
    "你好,世界!今天天气很好,我们去公园散步吧。机器学习模型需要大量的数据来训练。",
    "中文分词是自然语言处理中的一个重要问题。我们使用字节级别的编码方法。谢谢你的帮助!",
    "こんにちは世界。今日はいい天気ですね。カタカナとひらがな、そして漢字を使います。ありがとうございます。",
    "東京は日本の首都です。ラーメンとすしが好きです。プログラミングはたのしいです。",
    "مرحبا بالعالم! كيف حالك اليوم؟ اللغة العربية جميلة جدا، وشكرا لك على المساعدة.",
    "नमस्ते दुनिया! आप कैसे हैं? आज मौसम बहुत अच्छा है। धन्यवाद आपकी मदद के लिए।",
    "안녕하세요 세계! 오늘 날씨가 좋네요. 감사합니다.",
    "Emoji time 😀😃😄 👍👍🏽👍🏿 ❤️ 🎉🎉 👨‍👩‍👧‍👦 family, 🏳️‍🌈 flag, 👩🏽‍💻 coder, 🇩🇪🇯🇵 flags.",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n\tif (sum > limit) {\n\t\tbreak;\n\t}\n}\n",
    "class Tokenizer:\n    def __init__(self, vocab):\n        self.vocab = vocab\n\n    def encode(self, text):\n        return [self.vocab[t] for t in text.split()]\n",
    "{\"name\": \"mgrl\", \"version\": \"0.1.0\", \"layers\": [1, 2, 3], \"enabled\": true}\n",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;\r\nUPDATE users SET active = 1;\r\n",
    "Line one\r\nLine two\r\n\r\nLine four after an empty line\r\n",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 10000 123456789 3.14159 2.71828 1e-9 0xFF 0b1010",
    "Whitespace    runs     here\t\ttabs\t\t\tand\n\n\nnewlines   \n  trailing spaces   ",
    "    indented line\n        more indented\n            deepest\n",
    "https://huggingface.co/docs/tokenizers and mailto:someone@example.com or C:\\Users\\name\\file.txt",
    "Punctuation!!! Really??? Yes... -- (parentheses) [brackets] {braces} <angles> \"quotes\" 'single'",
    "The answer is 42. The answer is forty-two. THE ANSWER IS 42! the answer is 42?",
]
# repeat the common material so that merges form; the rare lines stay rare
CORPUS = CORPUS * 3 + [
    "English text appears most often, so English words become single tokens quickly.",
    "the of and to in is that for it with as was on be at by this had not are but from or have an they which",
]

# ---- test strings: each is encoded (with and without special tokens) and decoded by the library ----
CASES = [
    "",
    " ",
    "  ",
    "\n",
    "\t",
    "a",
    "Hello world",
    " Hello world",
    "Hello world ",
    "  leading and trailing  ",
    "multiple   spaces    between     words",
    "tabs\tand\t\ttabs\t",
    "new\nlines\n\n\nmany\n\n",
    "CRLF\r\nline\r\n\r\nend\r\n",
    "\r\n\r\n",
    "\n   \n\t\n",
    "a   \n  b",
    "          ten spaces then text",
    "1234567890",
    "12345678901234567890123456789",
    "3.14159 and 1,000,000 and 2024-05-17",
    "Version 1.2.3 has 42 fixes",
    "I'm sure you're right; they'll know, we've seen, she'd say, it's fine. I'M LOUD, YOU'RE LOUD, DON'T.",
    "it’s a curly apostrophe and 'quoted' text",
    "The quick brown fox jumps over the lazy dog.",
    "Hello, World! How's it going?",
    "Die Größe der Straße überrascht mich. ÄÖÜäöüß",
    "Καλημέρα κόσμε!",
    "Привет, мир! Как дела?",
    "你好,世界。今天天气很好。",
    "こんにちは世界。カタカナとひらがな、漢字。",
    "مرحبا بالعالم",
    "नमस्ते दुनिया",
    "안녕하세요",
    "Mixed: English, Deutsch, Ελληνικά, русский, 中文, 日本語, العربية, हिन्दी.",
    "😀👍🏽❤️🎉",
    "👨‍👩‍👧‍👦 and 🏳️‍🌈 and 👩🏽‍💻",
    "🇩🇪🇯🇵🇺🇸",
    "def f(x):\n\treturn x ** 2\n",
    "    indented = True\n        more = False\n",
    "for (int i = 0; i < n; ++i) {\n  sum += a[i];\n}\n",
    "{\"key\": [1, 2, 3], \"nested\": {\"a\": null}}",
    "https://example.com/path?query=1&b=2#frag",
    "hi<|im_end|>there",
    "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    "<|endoftext|>",
    "text<|endoftext|>more text",
    "<|im_end|><|im_end|>",
    "<|im_end",
    "<|im_end|",
    "|im_end|>",
    "<s>Hello</s>",
    "<s> Hello </s>",
    "<unk>",
    "<0x41> is not a byte token in text",
    "<mask>",
    "The <mask> sat on the mat",
    "Fill:<mask> here",
    "use <tool_call>  {\"x\": 1}  </tool_call> now",
    "  <tool_call>",
    "mgrl is a trainer",
    "xmgrl is not a word",
    "mgrl, mgrl. (mgrl)",
    "the mgrlish word",
    "<think>\nreasoning here\n</think>\n\nanswer",
    "<extra> and a <extra>b",
    "café and cafe\u0301",
    "\u1100\u1161\u11a8 decomposed hangul",
    "ﬁne ligature ① ² Ⅻ ｆｕｌｌｗｉｄｔｈ",
    "e\u0301\u0301 stacked marks",
    "Rare: 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ☃ ꙮ 𓀀 ߷ ᚠᛇᚻ",
    "NEL\x85here NBSP\u00a0here IDEO\u3000SPACE LS\u2028PS\u2029",
    "Mongolian\u180evowel separator",
    "zero\u200bwidth\u200djoiner\u200cnon",
    "control \x00 \x01 \x1b[31m \x7f chars",
    "Tab\tbefore\u00a0nbsp and trailing\t",
    "--dash--separated--words; commas, and (parens) [brackets] x123y456",
    "a\n\n\n\n\n\n\n\n\n\nb",
    " " * 40 + "x",
    "word " * 30,
    "ſ long s: it'ſ and 'S",
    "Ünïcödé ÀÉÎÕÜ àéîõü ÇĞİŞ çğış",
    "tokenization of a very long word: pneumonoultramicroscopicsilicovolcanoconiosis",
    "[CLS] and [SEP] as text",
]


CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "What is 2+2?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3?"}],
    [{"role": "user", "content": "  Spaces around, a tab\t and newlines \n\n"},
     {"role": "assistant", "content": "Grüße! 你好 😀\n```python\nprint(1)\n```"}],
]


def write_chat_cases(d):
    """chat.jsonl: what transformers' apply_chat_template makes of CONVERSATIONS with this directory's
    tokenizer_config.json chat template (text, and ids as tokenize=True gives them)."""
    from transformers import PreTrainedTokenizerFast
    tok = PreTrainedTokenizerFast.from_pretrained(d)
    with open(os.path.join(d, "chat.jsonl"), "w", encoding="utf-8") as f:
        for conv in CONVERSATIONS:
            for gen in (False, True):
                text = tok.apply_chat_template(conv, add_generation_prompt=gen, tokenize=False)
                ids = tok.apply_chat_template(conv, add_generation_prompt=gen, tokenize=True)
                if not isinstance(ids, list):
                    ids = ids["input_ids"]
                f.write(json.dumps({"messages": conv, "add_generation_prompt": gen, "text": text, "ids": list(ids)},
                                   ensure_ascii=False) + "\n")


def ids_of(tok, text, add_special):
    return tok.encode(text, add_special_tokens=add_special).ids


def write_fixture(out_dir, name, tok, config, cases):
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    if isinstance(tok, str):  # a tokenizer.json as written (the library would rewrite it on save)
        with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
            f.write(tok)
    else:
        tok.save(os.path.join(d, "tokenizer.json"), pretty=False)
    # reload from the written file: the cases are computed from exactly what the C++ side reads
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)
        f.write("\n")
    n_roundtrip = 0
    with open(os.path.join(d, "cases.jsonl"), "w", encoding="utf-8") as f:
        for text in cases:
            ids = ids_of(tok, text, True)
            ids_ns = ids_of(tok, text, False)
            decoded = tok.decode(ids, skip_special_tokens=False)
            decoded_ns = tok.decode(ids_ns, skip_special_tokens=False)
            decoded_skip = tok.decode(ids, skip_special_tokens=True)
            n_roundtrip += decoded_ns == text
            f.write(json.dumps({"text": text, "ids": ids, "ids_no_special": ids_ns, "decoded": decoded,
                                "decoded_no_special": decoded_ns, "decoded_skip_special": decoded_skip},
                               ensure_ascii=False) + "\n")
    if config.get("chat_template"):
        write_chat_cases(d)
    print(f"{name}: vocab {tok.get_vocab_size(with_added_tokens=True)}, {len(cases)} cases, "
          f"{n_roundtrip} round-trip", file=sys.stderr)


def edited(tok, fn):
    """A copy of tok with its JSON passed through fn (for layouts the Python API cannot build directly)."""
    j = json.loads(tok.to_str())
    fn(j)
    return Tokenizer.from_str(json.dumps(j, ensure_ascii=False))


def added_token_config(tok):
    j = json.loads(tok.to_str())
    return {str(t["id"]): {k: t[k] for k in ("content", "lstrip", "normalized", "rstrip", "single_word", "special")}
            for t in j["added_tokens"]}


LLAMA3_CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + "
    "'\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def bytelevel_llama3():
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1600, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                "<|im_start|>", "<|im_end|>", "<|endoftext|>"]
    tok.add_special_tokens([AddedToken(s, normalized=False, special=True) for s in specials])
    tok.add_tokens([AddedToken("<tool_call>", lstrip=True, rstrip=True, normalized=False, special=False),
                    AddedToken("</tool_call>", lstrip=True, rstrip=True, normalized=False, special=False),
                    AddedToken("mgrl", single_word=True, normalized=True, special=False),
                    AddedToken("\n\n\n", normalized=False, special=False)])
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                      special_tokens=[("<|begin_of_text|>", bos)])])

    def to_string_merges(j):  # Llama-3's published tokenizer.json writes merges as "a b"
        j["model"]["merges"] = [" ".join(m) for m in j["model"]["merges"]]
    tok = edited(tok, to_string_merges)
    config = {"added_tokens_decoder": added_token_config(tok), "bos_token": "<|begin_of_text|>",
              "chat_template": LLAMA3_CHAT_TEMPLATE, "clean_up_tokenization_spaces": True,
              "eos_token": "<|eot_id|>", "model_max_length": 131072,
              "tokenizer_class": "PreTrainedTokenizerFast"}
    return tok, config


def bytelevel_qwen2():
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1400, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    tok.add_special_tokens([AddedToken(s, normalized=False, special=True)
                            for s in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]])
    tok.add_tokens([AddedToken("<think>", normalized=False, special=False),
                    AddedToken("</think>", normalized=False, special=False),
                    AddedToken("café", normalized=True, special=False)])
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    config = {"added_tokens_decoder": added_token_config(tok), "bos_token": None, "chat_template": CHATML_TEMPLATE,
              "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
              "model_max_length": 32768, "tokenizer_class": "Qwen2Tokenizer"}
    return tok, config


def bytelevel_gpt2():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1200, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    tok.add_special_tokens([AddedToken("<|endoftext|>", normalized=False, special=True)])
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    config = {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "tokenizer_class": "GPT2Tokenizer"}
    return tok, config


def roberta_from(gpt2):
    tok = Tokenizer.from_str(gpt2.to_str())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    tok.add_special_tokens([AddedToken("<s>", normalized=False, special=True),
                            AddedToken("</s>", normalized=False, special=True),
                            AddedToken("<pad>", normalized=False, special=True),
                            AddedToken("<mask>", lstrip=True, normalized=False, special=True)])
    tok.post_processor = processors.RobertaProcessing(("</s>", tok.token_to_id("</s>")),
                                                      ("<s>", tok.token_to_id("<s>")),
                                                      trim_offsets=True, add_prefix_space=True)
    config = {"bos_token": "<s>", "eos_token": "</s>", "mask_token": "<mask>", "tokenizer_class": "RobertaTokenizer"}
    return tok, config


def splits_from(gpt2):
    tok = Tokenizer.from_str(gpt2.to_str())
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace("’", "'"),
                                           normalizers.Replace(Regex(r"\d{4,}"), "#"), normalizers.Strip()])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split("--", behavior="removed"),
        pre_tokenizers.Split(Regex(r"[,;]"), behavior="merged_with_previous"),
        pre_tokenizers.Split(Regex(r"[(\[]"), behavior="merged_with_next"),
        pre_tokenizers.Split(Regex(r"\s"), behavior="contiguous"),
        pre_tokenizers.Split(Regex(r"\w+"), behavior="removed", invert=True),
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)])
    tok.add_special_tokens([AddedToken("[CLS]", normalized=False, special=True),
                            AddedToken("[SEP]", normalized=False, special=True)])
    tok.post_processor = processors.BertProcessing(("[SEP]", tok.token_to_id("[SEP]")),
                                                   ("[CLS]", tok.token_to_id("[CLS]")))
    return tok, {"cls_token": "[CLS]", "sep_token": "[SEP]"}


def sentencepiece_llama2():
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    # trained on Metaspace-split words (SentencePiece does not merge across spaces), served like Llama-2
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    # the 180 most frequent characters (ties by code point) are the alphabet; the others need byte fallback.
    # (Chosen here rather than by limit_alphabet alone, whose ties fall in hash order: not reproducible.)
    counts = {}
    for line in CORPUS:
        for ch in "▁" + line.replace(" ", "▁"):
            counts[ch] = counts.get(ch, 0) + 1
    alphabet = sorted(counts, key=lambda ch: (-counts[ch], ch))[:180]
    trainer = trainers.BpeTrainer(vocab_size=1300, min_frequency=2, show_progress=False, limit_alphabet=len(alphabet),
                                  initial_alphabet=alphabet, special_tokens=["<unk>", "<s>", "</s>"] + byte_tokens)
    tok.train_from_iterator(CORPUS, trainer)

    def llama2_layout(j):
        j["added_tokens"] = [t for t in j["added_tokens"] if t["content"] not in byte_tokens]
        j["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
                                                               {"type": "Replace", "pattern": {"String": " "},
                                                                "content": "▁"}]}
        j["pre_tokenizer"] = None
        j["decoder"] = {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
            {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    tok = edited(tok, llama2_layout)
    tok.add_tokens([AddedToken("<extra>", normalized=True, special=False)])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B:1",
                                                       special_tokens=[("<s>", tok.token_to_id("<s>"))])
    config = {"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
              "unk_token": "<unk>", "legacy": True, "tokenizer_class": "LlamaTokenizer"}
    return tok, config


def metaspace_from(llama2, prepend_scheme, split):
    def layout(j):
        j["normalizer"] = None
        j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": prepend_scheme,
                              "split": split}
        j["decoder"] = {"type": "Sequence", "decoders": [
            {"type": "ByteFallback"},
            {"type": "Metaspace", "replacement": "▁", "prepend_scheme": prepend_scheme, "split": split}]}
    tok = edited(llama2, layout)
    config = {"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
              "unk_token": "<unk>", "legacy": False, "tokenizer_class": "LlamaTokenizer"}
    return tok, config


def metaspace_strip_from(llama2):
    """Metaspace "first" after normalizers that remove leading characters: the library prepends the replacement only
    where the normalized text still starts at original offset 0 (Strip, a Replace by nothing, a Replace of several
    characters by one take that away)."""
    def layout(j):
        j["normalizer"] = {"type": "Sequence", "normalizers": [
            {"type": "Strip", "strip_left": True, "strip_right": True},
            {"type": "Replace", "pattern": {"Regex": "^#+"}, "content": ""},
            {"type": "Replace", "pattern": {"Regex": "^%%+"}, "content": "x"},
            {"type": "Replace", "pattern": {"Regex": "^&"}, "content": "y"}]}
        j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False}
        j["decoder"] = {"type": "Sequence", "decoders": [
            {"type": "ByteFallback"}, {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first",
                                       "split": False}]}
    tok = edited(llama2, layout)
    config = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "legacy": False}
    return tok, config, ["x", " x", "\tx", "  Hello world", "#x", "## y", "#", "%%z", "%z", "&z", " &z", "<extra> x",
                         " <extra> x", "#<extra>", "x <extra>"]


def added_ids_from(gpt2):
    """added_tokens whose ids in the file are not the ids the library gives them when it reads the file (a content
    the vocab has, a gap, out of order, a content listed twice with other properties). Written as is."""
    j = json.loads(gpt2.to_str())
    vocab_word = "Hello"
    assert vocab_word in j["model"]["vocab"]

    def tok(content, id_, **kw):
        t = {"id": id_, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": False}
        t.update(kw)
        return t
    j["added_tokens"] += [tok(vocab_word, 1250), tok("<tool>", 1300), tok("<b>", 1302), tok("<a>", 1301),
                          tok("<tool>", 1300, lstrip=True, special=True), tok("<c>", 5)]
    return json.dumps(j, ensure_ascii=False), {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}, [
        "Hello", "Hello world", "<tool>", "x <tool> y", "<a><b><c>", "<b> and <a>", "<tool>Hello<c>"]


def unk_from(llama2):
    def layout(j):  # no byte fallback: characters outside the vocab become <unk>, runs of them one <unk>
        j["model"]["byte_fallback"] = False
    return edited(llama2, layout), {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "data", "tokenizers"))
    args = ap.parse_args()
    print(f"tokenizers {tokenizers.__version__}", file=sys.stderr)

    gpt2, gpt2_config = bytelevel_gpt2()
    llama2, llama2_config = sentencepiece_llama2()
    fixtures = {
        "llama3_bytelevel": bytelevel_llama3(),
        "qwen2_bytelevel": bytelevel_qwen2(),
        "gpt2_bytelevel": (gpt2, gpt2_config),
        "roberta_bytelevel": roberta_from(gpt2),
        "splits_bytelevel": splits_from(gpt2),
        "llama2_sentencepiece": (llama2, llama2_config),
        "metaspace_first": metaspace_from(llama2, "first", False),
        "metaspace_split": metaspace_from(llama2, "always", True),
        "sentencepiece_unk": unk_from(llama2),
        "metaspace_strip": metaspace_strip_from(llama2),
        "added_ids": added_ids_from(gpt2),
    }
    for name, (tok, config, *extra) in fixtures.items():
        write_fixture(args.out, name, tok, config, CASES + (extra[0] if extra else []))
    import transformers
    with open(os.path.join(args.out, "VERSIONS"), "w") as f:
        f.write(f"tokenizers {tokenizers.__version__}\ntransformers {transformers.__version__}\n"
                f"python {sys.version.split()[0]}\n")


if __name__ == "__main__":
    main()
