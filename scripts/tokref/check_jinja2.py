"""Checks the chat renderings in internal/hftok/testdata/reference.json with
Python Jinja2 set up as transformers' apply_chat_template sets it up
(transformers/utils/chat_template_utils.py: a sandboxed environment with
trim_blocks, lstrip_blocks, loopcontrols and the generation tag, tojson without ASCII escaping,
raise_exception), passing the special tokens the tokenizer sets.

usage: python3 check_jinja2.py internal/hftok/testdata
"""
import json
import os
import sys
from datetime import datetime

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt):
    return datetime.now().strftime(fmt)


class AssistantTracker(Extension):
    """transformers' {% generation %} tag, which renders its body as is
    (transformers also records where it lies, which does not change it)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def compile_template(source):
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[AssistantTracker, loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)


def special_tokens(cfg):
    out = {}
    for name in ("bos_token", "eos_token", "unk_token", "pad_token"):
        v = cfg.get(name)
        if isinstance(v, dict):
            v = v.get("content")
        if v:
            out[name] = v
    return out


def main():
    testdata = sys.argv[1]
    with open(os.path.join(testdata, "reference.json"), encoding="utf-8") as f:
        ref = json.load(f)
    bad = 0
    for i, chat in enumerate(ref["chats"]):
        with open(os.path.join(testdata, chat["model"], "tokenizer_config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
        tmpl = compile_template(cfg["chat_template"])
        got = tmpl.render(messages=chat["messages"], add_generation_prompt=True, **special_tokens(cfg))
        if got != chat["rendered"]:
            bad += 1
            print(f"chat {i}: Jinja2 renders\n{got!r}\nreference.json has\n{chat['rendered']!r}")
    print(f"Jinja2 {jinja2.__version__}: {len(ref['chats']) - bad} of {len(ref['chats'])} chats match")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
