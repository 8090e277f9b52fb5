"""Renders the chat requests of internal/modeltok/testdata/tool_chats.json,
then the Anthropic Messages requests of anthropic_chats.json (turned into
chat requests as vllm/entrypoints/anthropic/serving.py turns them) and the
Responses API requests of responses_chats.json (turned into chat requests
as vllm/entrypoints/openai/responses/utils.py turns them), as vLLM renders
them, for TestToolChatsMatchJinja2: each OpenAI request's
messages and tools are turned into the conversation and tool dicts vLLM
hands to transformers' apply_chat_template (vllm/entrypoints/chat_utils.py:
_parse_chat_message_content with the content format vLLM detects for the
template, developer messages made system ones for a template without that
role, then _postprocess_messages; tools as ChatCompletionToolsParam.model_dump() with
the serializers of vllm/entrypoints/generate/base/protocol.py), then
rendered with Python Jinja2 set up as transformers sets it up
(check_jinja2.py), with Qwen2.5's template and every template of DIR.

usage: python3 scripts/tokref/vllm_chat.py DIR
       (DIR: ardanlabs/jinja's testdata/templates, see README.md)
writes internal/modeltok/testdata/tool_renders.json
"""
import glob
import json
import os
import sys
from collections import deque

import jinja2
import jinja2.nodes

sys.path.insert(0, os.path.dirname(__file__))
from check_jinja2 import TEMPLATE_VARS, compile_template, pinned_strftime_now, special_tokens  # noqa: E402

MODELTOK = "internal/modeltok/testdata"
QWEN = "internal/hftok/testdata/qwen2_5/tokenizer_config.json"


# vLLM's content-format detection (_detect_content_format and the helpers
# it calls, vllm/renderers/hf.py): "openai" when the template loops over a
# message's content or over a variable named content.
def _var(node, name):
    return isinstance(node, jinja2.nodes.Name) and node.ctx == "load" and node.name == name


def _attr(node, name, key):
    if isinstance(node, jinja2.nodes.Getitem):
        return _var(node.node, name) and isinstance(node.arg, jinja2.nodes.Const) and node.arg.value == key
    if isinstance(node, jinja2.nodes.Getattr):
        return _var(node.node, name) and node.attr == key
    return False


def _var_or_elems(node, name, key=None):
    if isinstance(node, jinja2.nodes.Filter):
        return node.node is not None and _var_or_elems(node.node, name, key)
    if isinstance(node, jinja2.nodes.Test):
        return _var_or_elems(node.node, name, key)
    if isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice):
        return _var_or_elems(node.node, name, key)
    return _attr(node, name, key) if key else _var(node, name)


def _assigned(root, name):
    yield name
    todo = deque([name])
    while todo:
        n = todo.popleft()
        for a in root.find_all(jinja2.nodes.Assign):
            if _var_or_elems(a.node, n):
                yield a.target.name
                if a.target.name != n:
                    todo.append(a.target.name)


def content_format(tmpl):
    root = tmpl.environment.parse(tmpl.source)
    lists = list(_assigned(root, "messages"))
    msgs = [l.target.name for l in root.find_all(jinja2.nodes.For) if any(_var_or_elems(l.iter, v) for v in lists)]
    for l in root.find_all(jinja2.nodes.For):
        if any(_var_or_elems(l.iter, v, "content") for v in msgs):
            return "openai"
        if isinstance(l.iter, jinja2.nodes.Name) and l.iter.name == "content":
            return "openai"
    return "string"


def tool_dump(tool):
    """ChatCompletionToolsParam.model_dump(): declared fields only, in their
    order; description and parameters even when None; strict and
    defer_loading only when set."""
    f = tool["function"]
    fn = {"name": f["name"], "description": f.get("description"), "parameters": f.get("parameters")}
    if f.get("strict") is not None:
        fn["strict"] = f["strict"]
    return {"type": tool.get("type", "function"), "function": fn}


def tool_call(c):
    """A tool call as pydantic validates it into openai's TypedDict: id,
    function (arguments, name), type."""
    return {"id": c["id"], "function": {"arguments": c["function"]["arguments"], "name": c["function"]["name"]}, "type": c["type"]}


def conversation(messages, fmt, developer):
    out = []
    for m in messages:
        content = m.get("content")
        if content is None:
            texts = []
        elif isinstance(content, str):
            texts = [content]
        else:
            texts = [p["text"] for p in content if p.get("text") is not None]
        if fmt == "openai" and m["role"] != "tool":  # tool results are joined into a string
            msg = {"role": m["role"], "content": [{"type": "text", "text": t} for t in texts]}
        else:
            msg = {"role": m["role"], "content": "\n".join(texts)}
        if m["role"] == "assistant":
            if m.get("tool_calls") is not None:
                msg["tool_calls"] = [tool_call(c) for c in m["tool_calls"]]
        elif m["role"] == "tool":
            if "tool_call_id" in m:
                msg["tool_call_id"] = m["tool_call_id"]
        if isinstance(m.get("name"), str):
            msg["name"] = m["name"]
        if m["role"] == "developer":
            msg["tools"] = m.get("tools")
        out.append(msg)
    if any(m["role"] == "developer" for m in out) and not developer:
        # _convert_developer_to_system, then _consolidate_system_messages
        out = [dict({k: v for k, v in m.items() if k != "tools"}, role="system") if m["role"] == "developer" else m for m in out]
        systems, rest, merge = [], [], False
        for i, m in enumerate(out):
            if m["role"] == "system":
                merge = merge or i > 0 or bool(systems)
                c = m.get("content", "")
                if isinstance(c, list):
                    c = "\n".join(p["text"] if isinstance(p, dict) else p for p in c if isinstance(p, str) or "text" in p)
                if c:
                    systems.append(c)
            else:
                rest.append(m)
        if merge:
            out = [{"role": "system", "content": "\n\n".join(systems)}] + rest
    for msg in out:  # _postprocess_messages
        if msg["role"] == "assistant" and "tool_calls" in msg:
            if len(msg["tool_calls"]) == 0:
                del msg["tool_calls"]
                continue
            for item in msg["tool_calls"]:
                a = item["function"].get("arguments")
                if isinstance(a, str):
                    try:
                        item["function"]["arguments"] = json.loads(a)
                    except json.JSONDecodeError:
                        item["function"]["arguments"] = {}
                elif not isinstance(a, (dict, list)):
                    item["function"]["arguments"] = {}
    return out


def anthropic_to_chat(req):
    """AnthropicServingMessages._convert_anthropic_to_openai_request, the
    parts that shape the prompt: the system blocks joined (Claude Code's
    billing header block left out), tool_use blocks as tool calls with the
    input as their arguments, a user's tool_result blocks as tool messages
    ahead of it, tools as functions of their input_schema."""
    out = []
    parts = []
    system = req.get("system")
    if isinstance(system, str):
        if system:
            parts.append(system)
    elif system:
        for b in system:
            if b.get("type") == "text" and b.get("text") and not b["text"].startswith("x-anthropic-billing-header"):
                parts.append(b["text"])
    for m in req["messages"]:
        if m["role"] != "system":
            continue
        if isinstance(m["content"], str):
            parts.append(m["content"])
        else:
            parts += [b["text"] for b in m["content"] if b.get("type") == "text" and b.get("text")
                      and not b["text"].startswith("x-anthropic-billing-header")]
    if parts:
        out.append({"role": "system", "content": "".join(parts)})
    for m in req["messages"]:
        if m["role"] == "system":
            continue
        msg = {"role": m["role"]}
        if isinstance(m["content"], str):
            msg["content"] = m["content"]
        else:
            content, calls = [], []
            for b in m["content"]:
                if b["type"] == "text" and b.get("text"):
                    content.append({"type": "text", "text": b["text"]})
                elif b["type"] == "tool_use":
                    calls.append({"id": b["id"], "type": "function",
                                  "function": {"name": b.get("name") or "", "arguments": json.dumps(b.get("input") or {})}})
                elif b["type"] == "tool_result":
                    if m["role"] == "user":
                        c = b.get("content")
                        if isinstance(c, list):
                            c = "\n".join(i.get("text", "") for i in c if isinstance(i, dict) and i.get("type") == "text")
                        out.append({"role": "tool", "tool_call_id": b.get("tool_use_id") or "", "content": c or ""})
                    else:
                        content.append({"type": "text", "text": f"Tool result: {str(b.get('content')) if b.get('content') else ''}"})
            if calls:
                msg["tool_calls"] = calls
            if content:
                msg["content"] = content[0]["text"] if len(content) == 1 else content
        if not (m["role"] == "user" and "content" not in msg):
            out.append(msg)
    chat = {"messages": out}
    if req.get("tools") is not None:
        chat["tools"] = [{"type": "function", "function": {"name": t["name"], "description": t.get("description"),
                                                           "parameters": t.get("input_schema")}} for t in req["tools"]]
    if req.get("chat_template_kwargs") is not None:
        chat["chat_template_kwargs"] = req["chat_template_kwargs"]
    return chat


def responses_to_chat(req):
    """The chat vLLM's /v1/responses renders for a Responses API request
    (construct_input_messages and construct_tool_dicts of
    vllm/entrypoints/openai/responses/utils.py, build_chat_params of its
    protocol.py), for the items the requests use: instructions as a first
    system message, a string input as a user message, function calls as
    assistant tool calls (merged into the assistant message before them),
    an assistant message as its first part's text (the content of the
    message before it when that has none), call outputs as tool messages,
    input_text parts as text, function tools as chat functions."""
    msgs = []
    if req.get("instructions"):
        msgs.append({"role": "system", "content": req["instructions"]})
    if isinstance(req["input"], str):
        msgs.append({"role": "user", "content": req["input"]})
    else:
        for item in req["input"]:
            prev = msgs[-1] if msgs and msgs[-1]["role"] == "assistant" else None
            kind = item.get("type", "message")
            if kind == "function_call":
                name = item["name"]
                if item.get("namespace"):
                    name = item["namespace"] + "__" + name
                call = {"id": item["call_id"], "type": "function", "function": {"name": name, "arguments": item["arguments"]}}
                if prev is not None:
                    prev["tool_calls"] = prev.get("tool_calls", []) + [call]
                else:
                    msgs.append({"role": "assistant", "tool_calls": [call]})
            elif kind == "function_call_output":
                out = item["output"]
                if isinstance(out, list):
                    out = [{"type": "text", "text": p["text"]} for p in out]
                msgs.append({"role": "tool", "content": out, "tool_call_id": item["call_id"]})
            elif item["role"] == "assistant":
                c = item["content"]
                text = c if isinstance(c, str) else (c[0]["text"] if c else "")
                if prev is not None and prev.get("content") is None:
                    prev["content"] = text
                else:
                    msgs.append({"role": "assistant", "content": text})
            else:
                c = item["content"]
                if isinstance(c, list):
                    c = [{"type": "text", "text": p["text"]} for p in c]
                msgs.append({"role": item["role"], "content": c})
    chat = {"messages": msgs}
    if req.get("tools"):
        chat["tools"] = [{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}}
                         for t in req["tools"] if t["type"] == "function"]
    if (req.get("reasoning") or {}).get("effort") is not None:
        chat["reasoning_effort"] = req["reasoning"]["effort"]
    if req.get("chat_template_kwargs") is not None:
        chat["chat_template_kwargs"] = req["chat_template_kwargs"]
    return chat


def render(tmpl, req, variables):
    tools = req.get("tools")
    tools = None if tools is None else [tool_dump(t) for t in tools]
    developer = '"developer"' in tmpl.source or "'developer'" in tmpl.source
    # build_chat_params: the request's chat_template_kwargs, then what vLLM
    # sets itself (enable_thinking only for a reasoning_effort, unless given)
    kwargs = dict(req.get("chat_template_kwargs") or {})
    extra = dict(continue_final_message=False, reasoning_effort=req.get("reasoning_effort"))
    if req.get("reasoning_effort") is not None and "enable_thinking" not in kwargs:
        extra["enable_thinking"] = req["reasoning_effort"] != "none"
    kwargs.update(extra)
    try:
        conv = conversation(req["messages"], content_format(tmpl), developer)
        return tmpl.render(messages=conv, tools=tools, documents=None, add_generation_prompt=True, **variables, **kwargs)
    except Exception as e:  # noqa: BLE001 (a template that refuses the chat)
        return {"error": f"{type(e).__name__}: {e}"}


def main():
    folder = sys.argv[1]
    with open(os.path.join(MODELTOK, "tool_chats.json"), encoding="utf-8") as f:
        reqs = json.load(f)
    with open(os.path.join(MODELTOK, "anthropic_chats.json"), encoding="utf-8") as f:
        reqs += [anthropic_to_chat(r) for r in json.load(f)]
    with open(os.path.join(MODELTOK, "responses_chats.json"), encoding="utf-8") as f:
        reqs += [responses_to_chat(r) for r in json.load(f)]
    out = {}
    formats = {}
    with open(QWEN, encoding="utf-8") as f:
        cfg = json.load(f)
    tmpl = compile_template(cfg["chat_template"])
    tmpl.source = cfg["chat_template"]
    out["qwen2_5"] = [render(tmpl, r, special_tokens(cfg)) for r in reqs]
    formats["qwen2_5"] = content_format(tmpl)
    for path in sorted(glob.glob(os.path.join(folder, "*.jinja"))):
        with open(path, encoding="utf-8") as f:
            source = f.read()
        tmpl = compile_template(source)
        tmpl.source = source
        name = os.path.basename(path)
        out[name] = [render(tmpl, r, dict(TEMPLATE_VARS, strftime_now=pinned_strftime_now)) for r in reqs]
        formats[name] = content_format(tmpl)
    with open(os.path.join(MODELTOK, "tool_renders.json"), "w", encoding="utf-8") as f:
        json.dump({"jinja2": jinja2.__version__, "vars": TEMPLATE_VARS, "content_formats": formats, "templates": out},
                  f, ensure_ascii=False, indent=1)
        f.write("\n")
    errors = sum(isinstance(r, dict) for v in out.values() for r in v)
    print(f"rendered {len(out)} templates x {len(reqs)} requests ({errors} refused by their template)")
    print("(the requests of tool_chats.json, then those of anthropic_chats.json and responses_chats.json")
    print(" turned into chats as vLLM turns them)")


if __name__ == "__main__":
    main()
