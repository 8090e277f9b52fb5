"""Checks the chat renderings in internal/hftok/testdata/reference.json with
Python Jinja2 set up as transformers' apply_chat_template sets it up
(transformers/utils/chat_template_utils.py: a sandboxed environment with
trim_blocks, lstrip_blocks, loopcontrols and the generation tag, tojson without ASCII escaping,
raise_exception), passing the special tokens the tokenizer sets.

usage: python3 check_jinja2.py internal/hftok/testdata
       python3 check_jinja2.py internal/hftok/testdata --templates DIR
The second form renders the same conversations with every *.jinja in DIR
(ardanlabs/jinja's testdata/templates) and writes the results to
testdata/jinja2_templates.json, for TestJinjaModuleTemplatesMatchJinja2.
"""
import glob
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


# Fixed variables for the templates of --templates: generic special tokens
# and a pinned date (date_string, and strftime_now on 26 Jul 2024), so the
# output does not depend on the day it is made.
TEMPLATE_VARS = {"bos_token": "<s>", "eos_token": "</s>", "date_string": "26 Jul 2024"}


def pinned_strftime_now(fmt):
    return datetime(2024, 7, 26).strftime(fmt)


def render_templates(testdata, folder):
    with open(os.path.join(testdata, "reference.json"), encoding="utf-8") as f:
        ref = json.load(f)
    out = {}
    for path in sorted(glob.glob(os.path.join(folder, "*.jinja"))):
        with open(path, encoding="utf-8") as f:
            tmpl = compile_template(f.read())
        out[os.path.basename(path)] = [
            tmpl.render(
                messages=c["messages"],
                tools=None,
                documents=None,
                add_generation_prompt=True,
                strftime_now=pinned_strftime_now,
                **TEMPLATE_VARS,
            )
            for c in ref["chats"]
        ]
    with open(os.path.join(testdata, "jinja2_templates.json"), "w", encoding="utf-8") as f:
        json.dump({"jinja2": jinja2.__version__, "vars": TEMPLATE_VARS, "templates": out}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"rendered {len(out)} templates x {len(ref['chats'])} chats")


def main():
    testdata = sys.argv[1]
    if len(sys.argv) == 4 and sys.argv[2] == "--templates":
        render_templates(testdata, sys.argv[3])
        return
    with open(os.path.join(testdata, "reference.json"), encoding="utf-8") as f:
        ref = json.load(f)
    bad = 0
    for i, chat in enumerate(ref["chats"]):
        with open(os.path.join(testdata, chat["model"], "tokenizer_config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
        tmpl = compile_template(cfg["chat_template"])
        got = tmpl.render(messages=chat["messages"], tools=None, documents=None, add_generation_prompt=True, **special_tokens(cfg))
        if got != chat["rendered"]:
            bad += 1
            print(f"chat {i}: Jinja2 renders\n{got!r}\nreference.json has\n{chat['rendered']!r}")
    print(f"Jinja2 {jinja2.__version__}: {len(ref['chats']) - bad} of {len(ref['chats'])} chats match")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
