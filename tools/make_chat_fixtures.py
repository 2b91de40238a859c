#!/usr/bin/env python3
# make_chat_fixtures.py: renders the chat templates of tests/data/chat_templates/ (written in the style of the
# Llama-3, Qwen2.5, Qwen3, Gemma and Mistral families, plus features.jinja, which uses each Jinja construct once)
# with transformers' apply_chat_template over a set of conversations and writes what the library produces to
# tests/data/chat_templates/cases.jsonl. tests/unit/test_chat_template.cpp compares src/io/jinja.cpp and
# src/io/chat_template.cpp against it.
#
# Run by hand (no downloads: the tokenizers are the trained fixtures of tests/data/tokenizers):
#     python3 tools/make_chat_fixtures.py [--out tests/data/chat_templates]
# Needs: transformers (run with 5.24.0), jinja2 (3.1.6), tokenizers (0.23.3); the versions are written to VERSIONS.
#
# render_input.jsonl / render_expected.jsonl: what `mgrl render` must print for two of these conversations.
# Each line of cases.jsonl: {"template", "tokenizer", "messages", "add_generation_prompt", "kwargs"} and either
#   "error": the message transformers raised (raise_exception), or
#   "text": the rendered text, "ids": the tokenizer's ids of it (add_special_tokens=False, as apply_chat_template
#   encodes), "mask": the assistant mask and "mask_source":
#     "generation"  transformers' return_assistant_tokens_mask (the template has {% generation %})
#     "prefixes"    derived here from transformers' renderings of the conversation's prefixes: for each assistant
#                   message i, the text between render(messages[:i], add_generation_prompt=True) and
#                   render(messages[:i+1]) when both are prefixes of the whole rendering; tokens overlapping such a
#                   span are 1 (transformers' rule for generation spans)
import argparse
import json
import os
import sys

import jinja2
import tokenizers
import transformers
from transformers import AutoTokenizer
from transformers.utils.chat_template_utils import render_jinja_template

TEMPLATES = [  # (template, the tokenizer it is rendered with: tests/data/tokenizers/<name>, or a path from the root)
    ("llama3", "llama3_bytelevel"),
    ("qwen25", "qwen2_bytelevel"),
    ("qwen3", "qwen2_bytelevel"),
    ("gemma", "llama2_sentencepiece"),
    ("mistral", "llama2_sentencepiece"),
    ("features", "qwen2_bytelevel"),
    ("qwen25", "inputs/quickstart"),  # digits only: the template's text is <unk> tokens (their offsets, the mask)
]

SYSTEM = {"role": "system", "content": "You are a careful assistant.\n"}
CONVERSATIONS = [
    ("one_user", [{"role": "user", "content": "Hello!"}]),
    ("system_user_assistant", [SYSTEM, {"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}]),
    ("multi_turn", [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."},
                    {"role": "user", "content": "Another?"}, {"role": "assistant", "content": "Green, like grass."}]),
    ("system_multi_turn", [SYSTEM, {"role": "user", "content": "Q: capital of France?"},
                           {"role": "assistant", "content": "Paris."}, {"role": "user", "content": "And of Peru?"}]),
    ("whitespace_unicode", [{"role": "user", "content": "  Café au lait?\n\n"},
                            {"role": "assistant", "content": "\n Oui — très bon 日本 🙂 \n"}]),
]
QWEN3_EXTRA = [
    ("thinking_in_content", [{"role": "user", "content": "2*3?"},
                             {"role": "assistant", "content": "<think>\nmultiply\n</think>\n\n6"}]),
    ("thinking_multi_turn", [{"role": "user", "content": "1+1?"},
                             {"role": "assistant", "content": "<think>\nadd\n</think>\n\n2"},
                             {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]),
    ("reasoning_field", [{"role": "user", "content": "Why?"},
                         {"role": "assistant", "content": "Because.", "reasoning_content": "think first"}]),
]
ALTERNATION_ERROR = ("roles_do_not_alternate", [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])


def prefix_spans(render, messages, full):
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        p = render(messages[:i], True)
        q = render(messages[: i + 1], False)
        if q.startswith(p) and full.startswith(q) and len(q) > len(p):
            spans.append((len(p), len(q)))
    return spans


def mask_of(offsets, spans):  # transformers' rule: a token overlapping a span is 1
    mask = [0] * len(offsets)
    k = 0
    for t, (b, e) in enumerate(offsets):
        while k < len(spans) and b >= spans[k][1]:
            k += 1
        if k == len(spans):
            break
        if e > spans[k][0]:
            mask[t] = 1
    return mask


def main():
    ap = argparse.ArgumentParser()
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    ap.add_argument("--out", default=os.path.join(root, "tests", "data", "chat_templates"))
    args = ap.parse_args()
    tok_root = os.path.join(root, "tests", "data", "tokenizers")
    lines = []
    for name, tok_name in TEMPLATES:
        template = open(os.path.join(args.out, name + ".jinja"), encoding="utf-8").read()
        tok_dir = os.path.join(root, tok_name) if "/" in tok_name else os.path.join(tok_root, tok_name)
        hf = AutoTokenizer.from_pretrained(tok_dir)
        raw = tokenizers.Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
        generation = "{%- generation %}" in template or "{% generation %}" in template
        convs = list(CONVERSATIONS)
        if name == "qwen3":
            convs += QWEN3_EXTRA
        if name in ("gemma", "mistral"):
            convs.append(ALTERNATION_ERROR)
        kwarg_sets = [{}]
        if name == "qwen3":
            kwarg_sets.append({"enable_thinking": False})
        if name == "llama3":
            kwarg_sets.append({"date_string": "01 Jan 2026"})
        for kwargs in kwarg_sets:
            for case, messages in convs:
                for gen in (False, True):
                    def render(msgs, g):
                        return hf.apply_chat_template(msgs, chat_template=template, tokenize=False,
                                                      add_generation_prompt=g, **kwargs)
                    row = {"case": case, "template": name, "tokenizer": tok_name, "messages": messages,
                           "add_generation_prompt": gen, "kwargs": kwargs}
                    try:
                        text = render(messages, gen)
                    except jinja2.exceptions.TemplateError as e:
                        row["error"] = str(e)
                        lines.append(row)
                        continue
                    enc = raw.encode(text, add_special_tokens=False)
                    row["text"] = text
                    row["ids"] = enc.ids
                    if generation:
                        # transformers' generation spans, mapped to the tokenizers library's offsets with
                        # transformers' rule; where transformers' own tokenizer gives the same ids (not for the
                        # Llama-2 layout, which transformers 5 re-reads with its legacy rules), its
                        # return_assistant_tokens_mask must agree
                        rendered, spans = render_jinja_template(
                            conversations=[messages], chat_template=template, return_assistant_tokens_mask=True,
                            add_generation_prompt=gen, **{**hf.special_tokens_map, **kwargs})
                        assert rendered[0] == text
                        row["mask"] = mask_of(enc.offsets, spans[0])
                        row["mask_source"] = "generation"
                        out = hf.apply_chat_template(messages, chat_template=template, tokenize=True, return_dict=True,
                                                     return_assistant_tokens_mask=True, add_generation_prompt=gen,
                                                     **kwargs)
                        if list(out["input_ids"]) == enc.ids and list(out["assistant_masks"]) != row["mask"]:
                            sys.exit(f"{name}/{case}: the mask differs from transformers' assistant_masks")
                    else:
                        row["mask"] = mask_of(enc.offsets, prefix_spans(render, messages, text))
                        row["mask_source"] = "prefixes"
                    lines.append(row)
    with open(os.path.join(args.out, "cases.jsonl"), "w", encoding="utf-8") as f:
        for row in lines:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    # `mgrl render` (tests/CMakeLists.txt cli.render.*): two conversations through qwen3.jinja with enable_thinking
    # off, one ending with an assistant message (shown as SFT trains on it) and one not (a prompt, with the
    # generation prompt); the expected lines are transformers' text, ids and mask from above
    picks = [("thinking_multi_turn", False, "sft"), ("system_multi_turn", True, "prompt")]
    with open(os.path.join(args.out, "render_input.jsonl"), "w", encoding="utf-8") as fin, \
            open(os.path.join(args.out, "render_expected.jsonl"), "w", encoding="utf-8") as fexp:
        for index, (case, gen, use) in enumerate(picks):
            row = next(r for r in lines if r["template"] == "qwen3" and r["case"] == case and
                       r["add_generation_prompt"] == gen and r["kwargs"] == {"enable_thinking": False})
            fin.write(json.dumps({"messages": row["messages"]}, ensure_ascii=False) + "\n")
            mask = [0] * len(row["ids"]) if use == "prompt" else [0] + row["mask"][1:]
            out = {"index": index, "use": use, "text": row["text"], "tokens": row["ids"], "assistant_mask": mask}
            fexp.write(json.dumps(out, ensure_ascii=False, sort_keys=True, separators=(",", ":")) + "\n")
    # `mgrl render` keeps the data line's key order (cli.render.keeps_the_data_key_order): tool_call.jinja prints a
    # tool call's function with tojson over tool_call_input.jsonl; the expected text is transformers', json.dumps'd
    with open(os.path.join(args.out, "tool_call_input.jsonl"), encoding="utf-8") as f:
        messages = json.loads(f.readline())["messages"]
    template = open(os.path.join(args.out, "tool_call.jinja"), encoding="utf-8").read()
    hf = AutoTokenizer.from_pretrained(os.path.join(tok_root, "qwen2_bytelevel"))
    with open(os.path.join(args.out, "tool_call_expected.txt"), "w", encoding="utf-8") as f:
        f.write(json.dumps(hf.apply_chat_template(messages, chat_template=template, tokenize=False,
                                                  add_generation_prompt=True)) + "\n")
    # transformers' assistant mask where a token straddles a span's end under trim_offsets (gpt2's ByteLevel
    # post-processor): cli.render.mask_with_trimmed_offsets
    template = open(os.path.join(args.out, "generation_trim.jinja"), encoding="utf-8").read()
    hf = AutoTokenizer.from_pretrained(os.path.join(tok_root, "gpt2_bytelevel"))
    with open(os.path.join(args.out, "generation_trim_input.jsonl"), encoding="utf-8") as fin, \
            open(os.path.join(args.out, "generation_trim_expected.jsonl"), "w", encoding="utf-8") as fexp:
        for line in fin:
            out = hf.apply_chat_template(json.loads(line)["messages"], chat_template=template, tokenize=True,
                                         return_dict=True, return_assistant_tokens_mask=True)
            fexp.write(json.dumps({"tokens": list(out["input_ids"]), "assistant_mask": list(out["assistant_masks"])}) +
                       "\n")
    with open(os.path.join(args.out, "VERSIONS"), "w") as f:
        f.write(f"transformers {transformers.__version__}\njinja2 {jinja2.__version__}\n"
                f"tokenizers {tokenizers.__version__}\npython {sys.version.split()[0]}\n")
    print(f"{len(lines)} cases written to {args.out}/cases.jsonl")


if __name__ == "__main__":
    main()
