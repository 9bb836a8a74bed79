#!/usr/bin/env python3
"""Render the chat-template fixtures with the reference renderer.

Writes tests/fixtures/templates/goldens.json: for every template in
tests/fixtures/templates/*.jinja and every conversation below (with
add_generation_prompt true and false), the variables and either the text
Python jinja2 renders or the error it raises.  tests/test_jinja.c compares
the C interpreter (src/tokenizer/jinja.c) with it byte for byte, so the tests
never need Python; rerun this only when fixtures change.

The environment is the one Hugging Face transformers' apply_chat_template
builds (transformers/utils/chat_template_utils.py): an
ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the
loopcontrols extension and the {% generation %} tag, tojson = json.dumps(ensure_ascii=False) and the
globals raise_exception and strftime_now, the latter at the fixed time NOW
(UTC) that the C test passes too.

Needs python3-jinja2 (scripts/deps.sh, optional reference deps).
"""
import datetime
import json
import os
import sys

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols

HERE = os.path.dirname(os.path.abspath(__file__))
DIR = os.path.join(HERE, "..", "tests", "fixtures", "templates")

# bos / eos token texts of each model's vocabulary (others: <s> and </s>)
SPECIAL = {
    "meta-llama-Llama-3.1-8B-Instruct": ("<|begin_of_text|>", "<|eot_id|>"),
    "meta-llama-Llama-3.2-3B-Instruct": ("<|begin_of_text|>", "<|eot_id|>"),
    "Qwen-Qwen2.5-7B-Instruct": ("", "<|im_end|>"),
    "Qwen-Qwen3-0.6B": ("", "<|im_end|>"),
    "microsoft-Phi-3.5-mini-instruct": ("<s>", "<|endoftext|>"),
    "microsoft-phi-4": ("<|endoftext|>", "<|im_end|>"),
    "mistralai-Mistral-Nemo-Instruct-2407": ("<s>", "</s>"),
    "openai-gpt-oss-120b": ("<|startoftext|>", "<|return|>"),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "deepseek-ai-DeepSeek-V3.1": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "google-gemma-2-2b-it": ("<bos>", "<eos>"),
    "google-gemma-7b-it": ("<bos>", "<eos>"),
    "google-gemma-3-4b-it": ("<bos>", "<eos>"),
}

CONVERSATIONS = {
    "multi": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi there! How can I help?"},
        {"role": "user", "content": "Who are you?"},
    ],
    "single": [{"role": "user", "content": "What is 2+2?"}],
    "spaces": [
        {"role": "user", "content": "  héllo ☃ \n"},
        {"role": "assistant", "content": "\n  bonjour  "},
        {"role": "user", "content": "quote \" and ' and \\ and {{ not a tag }}"},
    ],
    "think": [
        {"role": "system", "content": "Think first."},
        {"role": "user", "content": "1+1?"},
        {"role": "assistant", "content": "<think>\nadding\n</think>\n\n2"},
        {"role": "user", "content": "and 2+2?"},
    ],
}


# A tool round trip, as kvsieve serve hands it to a template (src/tokenizer/
# tokenizer_chat.c): the request's tools, the assistant's call with empty
# content and its arguments as an object (a JSON string on the wire), the
# tool's result with tool_call_id and name.  Rendered for the templates that
# mention `tools` (those that take them).
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"}},
                   "required": ["city"]}}}]
TOOL_CONVERSATIONS = {
    "tools": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call00001", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "call00001", "name": "get_weather", "content": "18 C, clear"},
    ],
}


# Templates whose tool rendering the interpreter does not match, and why.
NO_TOOL_GOLDENS = {
    # `"..."|safe + t["function"]["name"]` makes the sum Markup, so jinja2 HTML-escapes what is added to it
    # (&#34; for quotes): autoescaping semantics src/tokenizer/jinja.c does not model.
    "meetkai-functionary-medium-v3.1",
}


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


NOW = 1767225600  # 2026-01-01 00:00:00 UTC


def strftime_now(fmt):
    return datetime.datetime.fromtimestamp(NOW, tz=datetime.timezone.utc).strftime(fmt)


class AssistantTracker(Extension):
    """transformers' {% generation %} marker: renders its body (the mask it
    records for training does not change the text)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def env():
    e = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[AssistantTracker, loopcontrols])
    e.filters["tojson"] = tojson
    e.globals["raise_exception"] = raise_exception
    e.globals["strftime_now"] = strftime_now
    return e


def main():
    out = {"now": NOW}
    e = env()
    for fn in sorted(os.listdir(DIR)):
        if not fn.endswith(".jinja"):
            continue
        name = fn[: -len(".jinja")]
        bos, eos = SPECIAL.get(name, ("<s>", "</s>"))
        with open(os.path.join(DIR, fn), encoding="utf-8") as f:
            src = f.read()
        tmpl = e.from_string(src)
        cases = []
        convs = [(k, m, None) for k, m in CONVERSATIONS.items()]
        if "tools" in src and name not in NO_TOOL_GOLDENS:
            convs += [(k, m, TOOLS) for k, m in TOOL_CONVERSATIONS.items()]
        for conv_name, msgs, tools in convs:
            for agp in (True, False):
                v = {"messages": msgs, "add_generation_prompt": agp, "bos_token": bos, "eos_token": eos}
                if tools:
                    v["tools"] = tools
                case = {"name": "%s/%s" % (conv_name, "gen" if agp else "nogen"), "vars": v}
                try:
                    case["expected"] = tmpl.render(**v)
                except jinja2.exceptions.TemplateError as ex:
                    if tools and isinstance(ex, jinja2.exceptions.SecurityError):
                        print("%s/%s: skipped (%s)" % (name, case["name"], ex), file=sys.stderr)
                        continue
                    case["error"] = str(ex)
                except TypeError as ex:
                    # a tools case the reference itself cannot render (a variable shape no request gives; above,
                    # list.append, which transformers' immutable sandbox refuses): skipped, named
                    if not tools:
                        raise
                    print("%s/%s: skipped (%s)" % (name, case["name"], ex), file=sys.stderr)
                    continue
                cases.append(case)
        out[name] = cases
    path = os.path.join(DIR, "goldens.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("wrote", path, file=sys.stderr)


if __name__ == "__main__":
    main()
