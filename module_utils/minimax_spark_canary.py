"""The verify role's canary engine: the requests it sends to llama-server's three API surfaces (chat completions,
Responses, Anthropic Messages), streamed and not, the reading of each surface's reply (JSON or server-sent events)
and the verdicts (tool call, tool result answered, multi-turn, reasoning in each API's own field), each ending
with the project's own message: what came back, what was served and what to do.

The verdict functions read replies in the shape of the ``uri`` module's result (``{status, json, content, msg}``);
``send`` turns an HTTP exchange into that shape, ``run`` asks everything and judges it (library/endpoint_canary).
"""
from __future__ import annotations

import json
import re

from ansible.module_utils.minimax_spark_http import HAS_REQUESTS, make_session

if HAS_REQUESTS:
    import requests

#: Tool-call and reasoning markup that must never reach a reply's ``content``: when it does, the
#: parser llama-server picked (by the template) does not match what the model writes.
MARKUP = (
    "]<]minimax[>[",
    "<minimax:tool_call>",
    "</minimax:tool_call>",
    "<tool_call>",
    "<invoke name=",
    "<mm:think>",
    "</mm:think>",
    "<think>",
    "</think>",
)

#: Reasoning markup: never in any reply's content (a plain question without tools may answer with a tool
#: call as text, which is not a leak).
REASONING_MARKUP = ("<mm:think>", "</mm:think>", "<think>", "</think>")

EXCERPT = 160

FIXES = {
    "unreachable": (
        "llama-server is not answering: run the head_server tag (ansible-playbook site.yml --tags head_server) "
        "and read its log (/var/log/minimax-spark/minimax-llama-server.log or journalctl -u minimax-llama-server)"
    ),
    "http": (
        "read llama-server's log; HTTP 401 means verify_api_key does not match head_server_api_key, "
        "HTTP 404 that this llama.cpp build does not serve that API (build a newer one), "
        "HTTP 5xx that the template fails to render or the model is broken"
    ),
    "stream": (
        "read llama-server's log for the error at that time: a stream that ends early means llama-server stopped "
        "or crashed mid-reply, or something between the client and the head cuts streams"
    ),
    "wrong_stop": (
        "agents stop at a reply whose stop reason is not the tool call's: this llama.cpp build converts replies "
        "for this API wrongly; use a build whose server reports it (a newer llama.cpp)"
    ),
    "length": (
        "the reply was cut at verify_max_tokens before the tool call ended: raise verify_max_tokens "
        "(or the model loops: check the GGUF)"
    ),
    "markup": (
        "the model writes its tool calls or reasoning in a format the served template's parser does not "
        "recognise: set hybrid_template_mode to the other template (auto tries both), or use a llama.cpp "
        "build whose parser matches the model"
    ),
    "no_tool_calls": (
        "the model answered in text instead of calling get_weather: the template does not offer it the tools "
        "the way it was trained, or the GGUF is not a tool-calling MiniMax model (or is corrupt): check the "
        "model and hybrid_template_mode"
    ),
    "wrong_name": (
        "the model called another tool than the one offered: the template renders the tool list wrongly, "
        "or the GGUF is corrupt"
    ),
    "bad_arguments": (
        "the tool call's arguments are not a JSON object: the parser and the model's format disagree "
        "(set hybrid_template_mode to the other template) or the GGUF is corrupt"
    ),
    "no_reasoning": (
        "clients read M3's reasoning only from that field (chat: reasoning_content; Responses: the reasoning item; "
        "Messages: the thinking block) and send it back with the next turn, so llama-server must split it out of the "
        "text: take --reasoning-format none (or deepseek-legacy) and whatever turns thinking off (thinking_mode or "
        "enable_thinking in --chat-template-kwargs, --reasoning-budget 0) out of head_server_extra_args; thinking "
        "markup in the text means the served template's parser does not read the model's thinking tags (set "
        "hybrid_template_mode to the other template, auto tries both)"
    ),
    "answers": (
        "a reply of the plain question or of a tool-result turn is wrong: markup in the text means the served "
        "template's parser does not read the model's format (set hybrid_template_mode to the other template); "
        "HTTP 4xx/5xx on one API's tool-result turn means the template does not render that API's history "
        "(its tool call, tool result or replayed reasoning): read llama-server's log, fix or replace the template"
    ),
}


def _excerpt(value, size=EXCERPT):
    if value is None:
        return ""
    if not isinstance(value, str):
        try:
            value = json.dumps(value, sort_keys=True)
        except (TypeError, ValueError):
            value = str(value)
    value = value.replace("\n", "\\n")
    return value if len(value) <= size else value[:size] + "..."


def _dig(data, *keys):
    for key in keys:
        if isinstance(data, dict):
            data = data.get(key)
        elif isinstance(data, list) and isinstance(key, int) and -len(data) <= key < len(data):
            data = data[key]
        else:
            return None
    return data


def markup_in(text, markup=MARKUP):
    """The markup strings found in ``text`` (a reply's content), in ``markup`` order."""
    if not isinstance(text, str):
        return []
    return [m for m in markup if m in text]


def _http_detail(result):
    """What an HTTP error said: llama-server's own error message (its last ``Error:`` line for a template
    exception) where the body is its JSON error, else the body or the client's message."""
    content = result.get("content")
    try:
        message = json.loads(content)["error"]["message"]
    except (TypeError, ValueError, KeyError):
        message = None
    if isinstance(message, str) and message.strip():
        return message.strip().split("\nError: ")[-1].strip()
    return content or result.get("msg") or result.get("json")


def _served(mode, chat_format, url):
    return "template mode %s, chat format %s, at %s" % (mode or "unknown", chat_format or "unknown", url or "?")


#: The API surfaces llama-server serves, by key: their path and what a tool call is called in their replies.
SURFACES = {
    "chat": {"path": "/v1/chat/completions", "calls": "tool_calls", "stop": "finish_reason"},
    "responses": {"path": "/v1/responses", "calls": "function_call items", "stop": "status"},
    "messages": {"path": "/v1/messages", "calls": "tool_use blocks", "stop": "stop_reason"},
}

#: Where each surface's clients read the reasoning, in the surface's own words.
REASONING_FIELD = {"chat": "reasoning_content", "responses": "a reasoning output item",
                   "messages": "a thinking block"}

#: The stop reason a tool call must come with, where the surface has one (clients loop on it).
TOOL_STOP = {"chat": "tool_calls", "messages": "tool_use"}


def surface_label(surface, stream=False):
    """``/v1/messages`` or ``/v1/messages (streamed)``."""
    path = SURFACES.get(surface, SURFACES["chat"])["path"]
    return path + (" (streamed)" if stream else "")


def sse_events(text):
    """The events of a server-sent-events body: ``[(event name or None, data)]``, data parsed as JSON where it
    is JSON (``[DONE]`` and other text stay strings)."""
    events = []
    if not isinstance(text, str):
        return events
    for block in text.replace("\r\n", "\n").split("\n\n"):
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip(" "))
        if not data:
            continue
        payload = "\n".join(data)
        try:
            payload = json.loads(payload)
        except ValueError:
            pass
        events.append((name, payload))
    return events


def _text_of(value):
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(_text_of(v.get("text")) if isinstance(v, dict) else _text_of(v) for v in value)
    return ""


def _chat_reply(body, stream):
    reply = {"stop": None, "text": "", "reasoning": "", "calls": [], "complete": True, "error": None}
    if not stream:
        message = _dig(body, "choices", 0, "message")
        message = message if isinstance(message, dict) else {}
        reply.update(stop=_dig(body, "choices", 0, "finish_reason"), text=_text_of(message.get("content")),
                     reasoning=_text_of(message.get("reasoning_content")))
        for call in message.get("tool_calls") or []:
            call = call if isinstance(call, dict) else {}
            reply["calls"].append({"id": call.get("id"), "name": _dig(call, "function", "name"),
                                   "arguments": _dig(call, "function", "arguments")})
        return reply
    calls = {}
    reply["complete"] = False
    for _, data in body:
        if data == "[DONE]":
            reply["complete"] = True
            continue
        if not isinstance(data, dict):
            continue
        if "error" in data:
            reply["error"] = data["error"]
            continue
        choice = _dig(data, "choices", 0) or {}
        if choice.get("finish_reason"):
            reply["stop"] = choice["finish_reason"]
        delta = choice.get("delta") or {}
        reply["text"] += _text_of(delta.get("content"))
        reply["reasoning"] += _text_of(delta.get("reasoning_content"))
        for part in delta.get("tool_calls") or []:
            call = calls.setdefault(part.get("index", 0), {"id": None, "name": None, "arguments": ""})
            call["id"] = part.get("id") or call["id"]
            call["name"] = _dig(part, "function", "name") or call["name"]
            call["arguments"] += _dig(part, "function", "arguments") or ""
    reply["calls"] = [calls[i] for i in sorted(calls)]
    return reply


def _responses_output(reply, output):
    for item in output if isinstance(output, list) else []:
        item = item if isinstance(item, dict) else {}
        kind = item.get("type")
        reply["items"].append(kind)
        if kind == "reasoning":
            reply["reasoning"] += _text_of(item.get("content")) or _text_of(item.get("summary"))
        elif kind == "message":
            reply["text"] += _text_of(item.get("content"))
        elif kind == "function_call":
            reply["calls"].append({"id": item.get("call_id"), "name": item.get("name"),
                                   "arguments": item.get("arguments")})


def _responses_reply(body, stream):
    reply = {"stop": None, "text": "", "reasoning": "", "calls": [], "complete": True, "error": None, "items": []}
    if not stream:
        reply["stop"] = body.get("status")
        reply["output_tokens"] = _dig(body, "usage", "output_tokens")
        _responses_output(reply, body.get("output"))
        reply["reasoning_item"] = reply["reasoning"]
        return reply
    reply["complete"] = False
    items, text, reasoning = [], "", ""
    for name, data in body:
        if not isinstance(data, dict):
            continue
        kind = data.get("type") or name
        if kind in ("error", "response.failed") or "error" in data and kind is None:
            reply["error"] = data.get("error") or data.get("message") or data
        elif kind == "response.output_text.delta":
            text += _text_of(data.get("delta"))
        elif kind == "response.reasoning_text.delta":
            reasoning += _text_of(data.get("delta"))
        elif kind == "response.output_item.done":
            items.append(data.get("item"))
        elif kind == "response.completed":
            reply["complete"] = True
            reply["stop"] = _dig(data, "response", "status")
            reply["output_tokens"] = _dig(data, "response", "usage", "output_tokens")
    _responses_output(reply, items)
    # what a streaming client shows is the deltas; the items are what it keeps (and sends back)
    reply["reasoning_item"] = reply["reasoning"]
    reply["text"] = text or reply["text"]
    reply["reasoning"] = reasoning or reply["reasoning"]
    return reply


def _messages_blocks(reply, blocks):
    for block in blocks:
        block = block if isinstance(block, dict) else {}
        kind = block.get("type")
        reply["items"].append(kind)
        if kind == "thinking":
            reply["reasoning"] += _text_of(block.get("thinking"))
        elif kind == "text":
            reply["text"] += _text_of(block.get("text"))
        elif kind == "tool_use":
            reply["calls"].append({"id": block.get("id"), "name": block.get("name"), "arguments": block.get("input")})


def _messages_reply(body, stream):
    reply = {"stop": None, "text": "", "reasoning": "", "calls": [], "complete": True, "error": None, "items": []}
    if not stream:
        reply["stop"] = body.get("stop_reason")
        _messages_blocks(reply, body.get("content") if isinstance(body.get("content"), list) else [])
        return reply
    reply["complete"] = False
    blocks = {}
    for name, data in body:
        if not isinstance(data, dict):
            continue
        kind = data.get("type") or name
        if kind == "error":
            reply["error"] = data.get("error") or data
        elif kind == "content_block_start":
            blocks[data.get("index", len(blocks))] = dict(data.get("content_block") or {}, _json="")
        elif kind == "content_block_delta":
            block = blocks.setdefault(data.get("index", 0), {"type": None, "_json": ""})
            delta = data.get("delta") or {}
            if delta.get("type") == "text_delta":
                block["text"] = block.get("text", "") + _text_of(delta.get("text"))
            elif delta.get("type") == "thinking_delta":
                block["thinking"] = block.get("thinking", "") + _text_of(delta.get("thinking"))
            elif delta.get("type") == "input_json_delta":
                block["_json"] += delta.get("partial_json") or ""
        elif kind == "message_delta":
            reply["stop"] = _dig(data, "delta", "stop_reason")
        elif kind == "message_stop":
            reply["complete"] = True
    for block in blocks.values():
        if block.get("type") == "tool_use" and block["_json"]:
            try:
                block["input"] = json.loads(block["_json"])
            except ValueError:
                block["input"] = block["_json"]  # judged below: not a JSON object
    _messages_blocks(reply, [blocks[i] for i in sorted(blocks)])
    return reply


READERS = {"chat": _chat_reply, "responses": _responses_reply, "messages": _messages_reply}


def read_reply(result, surface="chat", stream=False):
    """One surface's reply (``{status, json, content, msg}``), streamed or not, as ``{status, body, stop, text,
    reasoning, calls: [{id, name, arguments}], items, complete, error, output_tokens}`` (Responses adds
    ``reasoning_item``: the reasoning of its ``reasoning`` items, what clients keep); ``body`` is False when no reply
    of the surface's shape came back."""
    result = result if isinstance(result, dict) else {}
    status = result.get("status", -1)
    try:
        status = int(status)
    except (TypeError, ValueError):
        status = -1
    if stream:
        body = sse_events(result.get("content"))
        ok = bool(body)
    else:
        body = result.get("json")
        ok = isinstance(body, dict)
    reply = {"stop": None, "text": "", "reasoning": "", "calls": [], "items": [], "complete": False, "error": None}
    if ok:
        reply.update(READERS.get(surface, _chat_reply)(body, stream))
    reply.update(status=status, body=ok)
    return reply


def _seen(surface, reply):
    """What came back, in the surface's own words."""
    calls = reply["calls"]
    first = calls[0] if calls else {}
    call = (", first call %s(%s)" % (first.get("name"), _excerpt(first.get("arguments")))) if calls else ""
    if surface == "responses":
        return "status=%s, output=[%s], text=%r, function_call items=%d%s" % (
            reply["stop"], ", ".join(str(i) for i in reply["items"]), _excerpt(reply["text"]), len(calls), call)
    if surface == "messages":
        return "stop_reason=%s, content=[%s], text=%r, tool_use blocks=%d%s" % (
            reply["stop"], ", ".join(str(i) for i in reply["items"]), _excerpt(reply["text"]), len(calls), call)
    return "finish_reason=%s, content=%r, tool_calls=%d%s" % (reply["stop"], _excerpt(reply["text"]), len(calls), call)


def canary_verdict(result, mode="", chat_format="", url="", max_tokens=None, tool_name="get_weather",
                   surface="chat", stream=False, required=("city",)):
    """Verdict of the tool-call canary on one surface (``chat``, ``responses`` or ``messages``, streamed or not)
    from its reply ``result`` (``{status, json, content, msg}``, what ``send`` returns).

    A pass needs the reasoning in the surface's own field (REASONING_FIELD), where its clients read it.

    Returns ``{ok, kind, surface, msg, what, status, finish_reason, content, reasoning, tool_call, call_id}``:
    ``kind`` is ``ok`` or one of FIXES' keys; ``msg`` names the surface and says what came back, what was served
    and what to do (the pass message on success); ``what`` is the failure without the served/fix tail.
    """
    label = surface_label(surface, stream)
    result = result if isinstance(result, dict) else {}
    reply = read_reply(result, surface, stream)
    status, calls = reply["status"], reply["calls"]
    first = calls[0] if calls else {}
    name, arguments = first.get("name"), first.get("arguments")
    verdict = {
        "ok": False, "surface": label, "status": status, "finish_reason": reply["stop"], "content": reply["text"],
        "reasoning": reply["reasoning"], "tool_call": {"name": name, "arguments": arguments} if calls else {},
        "call_id": first.get("id"),
    }
    served = _served(mode, chat_format, url)
    seen = _seen(surface, reply)
    what_calls = SURFACES.get(surface, SURFACES["chat"])["calls"]

    def fail(kind, what):
        verdict.update(kind=kind, what=what, msg="Tool-call canary failed on %s: %s. Served: %s. Fix: %s." % (
            label, what, served, FIXES[kind]))
        return verdict

    if status == -1:
        return fail("unreachable", "no answer from %s%s (%s)" % (
            url or "?", SURFACES.get(surface, SURFACES["chat"])["path"],
            _excerpt(result.get("msg", "connection failed"))))
    if status != 200 or not reply["body"]:
        return fail("http", "HTTP %s (%s)" % (status, _excerpt(_http_detail(result))))
    if reply["error"] is not None:
        return fail("stream", "the stream carried an error (%s)" % _excerpt(reply["error"]))
    if reply["stop"] in ("length", "max_tokens", "incomplete") or (
            surface == "responses" and max_tokens is not None and not calls
            and isinstance(reply.get("output_tokens"), int) and reply["output_tokens"] >= int(max_tokens)):
        return fail("length", "cut at max_tokens=%s (%s)" % (max_tokens if max_tokens is not None else "?", seen))
    if not reply["complete"]:
        return fail("stream", "the stream ended without its last event (%s)" % seen)
    found = markup_in(reply["text"])
    field = REASONING_FIELD.get(surface, REASONING_FIELD["chat"])
    if found and not reply["reasoning"].strip() and all(m in REASONING_MARKUP for m in found):
        return fail("no_reasoning", "the reasoning is not in %s: thinking markup %s in %s (%s)" % (
            field, ", ".join(found), "content" if surface == "chat" else "the text", seen))
    if found:
        return fail("markup", "tool-call or reasoning markup %s in %s (%s)" % (
            ", ".join(found), "content" if surface == "chat" else "the text", seen))
    if not calls:
        return fail("no_tool_calls", "no %s came back (%s)" % (what_calls, seen))
    if name != tool_name:
        return fail("wrong_name", "the tool call names %r, not %r (%s)" % (name, tool_name, seen))
    parsed = arguments
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except ValueError as exc:
            return fail("bad_arguments", "%s not JSON (%s) (%s)" % (
                "input is" if surface == "messages" else "arguments are", exc, seen))
    if not isinstance(parsed, dict):
        return fail("bad_arguments", "%s a JSON %s, not an object (%s)" % (
            "input is" if surface == "messages" else "arguments are", type(parsed).__name__, seen))
    missing = [key for key in required or () if key not in parsed]
    if missing:
        return fail("bad_arguments", "%s lack%s the required %s (%s)" % (
            "input" if surface == "messages" else "arguments", "s" if surface == "messages" else "",
            ", ".join(repr(k) for k in missing), seen))
    if surface in TOOL_STOP and reply["stop"] != TOOL_STOP[surface]:
        return fail("wrong_stop", "%s=%s with a tool call, not %s (%s)" % (
            SURFACES[surface]["stop"], reply["stop"], TOOL_STOP[surface], seen))
    if not reply.get("reasoning_item", reply["reasoning"]).strip():
        return fail("no_reasoning", "no reasoning in %s (%s)" % (field, seen))
    verdict.update(
        ok=True, kind="ok", what="", tool_call={"name": name, "arguments": parsed},
        msg="Tool-call canary passed on %s: %s(%s). Served: %s." % (
            label, name, json.dumps(parsed, sort_keys=True), served))
    return verdict


def surfaces_verdict(results, mode="", chat_format="", url="", max_tokens=None, tool_name="get_weather"):
    """Verdict of the canary on every surface, from its replies: ``{results: [...]}`` or a plain list, each reply
    with ``item: {surface, stream}``, the request it answers.

    Returns ``{ok, kind, msg, tool_call, reasoning, surfaces: {label: verdict}, replies: {surface: verdict of the
    non-streamed reply}}``: ``kind`` and the fix are the first failure's; the message names every surface that
    failed, with what came back, so one run tells which surfaces a change broke.
    """
    if isinstance(results, dict):
        results = results.get("results", [])
    verdicts = []
    for result in results or []:
        result = result if isinstance(result, dict) else {}
        item = result.get("item") if isinstance(result.get("item"), dict) else {}
        verdicts.append(canary_verdict(result, mode=mode, chat_format=chat_format, url=url, max_tokens=max_tokens,
                                       tool_name=tool_name, surface=item.get("surface", "chat"),
                                       stream=bool(item.get("stream"))))
    served = _served(mode, chat_format, url)
    failed = [v for v in verdicts if not v["ok"]]
    out = {
        "surfaces": {v["surface"]: v for v in verdicts},
        "replies": {key: v for key in SURFACES for v in verdicts if v["surface"] == surface_label(key)},
    }
    chat = out["replies"].get("chat") or (verdicts[0] if verdicts else {})
    out.update(tool_call=chat.get("tool_call", {}), reasoning=chat.get("reasoning", ""))
    if not verdicts:
        out.update(ok=False, kind="http", msg="Tool-call canary failed: no request was sent. Served: %s. Fix: %s." % (
            served, FIXES["http"]))
        return out
    if not failed:
        labels = [v["surface"] for v in verdicts]
        paths = [SURFACES[key]["path"] for key in SURFACES if SURFACES[key]["path"] in labels]
        both = paths and len(labels) == 2 * len(paths) and all(p + " (streamed)" in labels for p in paths)
        out.update(ok=True, kind="ok", msg="Tool-call canary passed on %s: %s(%s). Served: %s." % (
            (", ".join(paths) + ", each streamed and not") if both else ", ".join(labels),
            chat["tool_call"].get("name"),
            json.dumps(chat["tool_call"].get("arguments"), sort_keys=True), served))
        return out
    first = failed[0]
    also = ""
    if len(failed) > 1:
        also = " Also failed: %s." % "; ".join("%s: %s" % (v["surface"], _excerpt(v["what"], 240)) for v in failed[1:])
    passed = [v["surface"] for v in verdicts if v["ok"]]
    out.update(ok=False, kind=first["kind"], msg="Tool-call canary failed on %s: %s.%s%s Served: %s. Fix: %s." % (
        first["surface"], first["what"], also, (" Passed: %s." % ", ".join(passed)) if passed else "",
        served, FIXES[first["kind"]]))
    return out


def answers_verdict(replies, mode="", chat_format="", url=""):
    """Problems of the other replies (``{label: uri result}``; a result whose ``item`` holds ``{surface, stream,
    label}`` is read as that surface's reply and named by its label): HTTP errors, empty answers, markup in the
    text (reasoning markup only for ``chat``, the question asked without tools).

    Returns ``{ok, msg, answers: {label: text}}``.
    """
    problems, answers = [], {}
    for label, result in (replies or {}).items():
        result = result if isinstance(result, dict) else {}
        item = result.get("item") if isinstance(result.get("item"), dict) else {}
        surface = item.get("surface", "chat")
        label = item.get("label", label)
        reply = read_reply(result, surface, bool(item.get("stream")))
        answers[label] = reply["text"]
        if reply["status"] != 200 or not reply["body"]:
            problems.append("%s: HTTP %s (%s)" % (label, reply["status"],
                                                 _excerpt(_http_detail(result))))
            continue
        if reply["error"] is not None or (bool(item.get("stream")) and not reply["complete"]):
            problems.append("%s: the stream %s" % (label, "carried an error (%s)" % _excerpt(reply["error"])
                                                   if reply["error"] is not None else "ended without its last event"))
            continue
        found = markup_in(reply["text"], REASONING_MARKUP if label == "chat" else MARKUP)
        if found:
            problems.append("%s: markup %s in %s %r" % (label, ", ".join(found),
                                                       "content" if surface == "chat" else "the text",
                                                       _excerpt(reply["text"])))
        elif not reply["text"] and not reply["reasoning"] and not reply["calls"]:
            problems.append("%s: empty answer (%s=%s)" % (label, SURFACES.get(surface, SURFACES["chat"])["stop"],
                                                         reply["stop"]))
    if not problems:
        return {"ok": True, "answers": answers,
                "msg": "Chat and tool-result answers are clean. Served: %s." % _served(mode, chat_format, url)}
    return {"ok": False, "answers": answers, "msg": "Verify failed: %s. Served: %s. Fix: %s." % (
        "; ".join(problems), _served(mode, chat_format, url), FIXES["answers"])}


#: The canary's question, tool and tool result, the same on every surface.
QUESTION = "What is the weather in Paris? Use the get_weather tool."
TOOL = {
    "name": "get_weather",
    "description": "Get the current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city name."}},
                   "required": ["city"]},
}
TOOL_RESULT = '{"city": "Paris", "forecast": "sunny", "temperature_c": 21}'


def _tools(surface):
    if surface == "responses":
        return [dict(TOOL, type="function")]
    if surface == "messages":
        return [{"name": TOOL["name"], "description": TOOL["description"], "input_schema": TOOL["parameters"]}]
    return [{"type": "function", "function": dict(TOOL)}]


def _request(surface, stream, model, max_tokens, history, label=None):
    body = {"model": model, "temperature": 0, "tools": _tools(surface), "stream": bool(stream)}
    if surface == "responses":
        body.update(input=history, max_output_tokens=max_tokens)
    else:
        body.update(messages=history, max_tokens=max_tokens)
    return {"surface": surface, "stream": bool(stream), "path": SURFACES[surface]["path"],
            "label": label or surface_label(surface, stream), "body": body}


def _arguments_text(arguments):
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


def _arguments_object(arguments):
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return {}
    return arguments if isinstance(arguments, dict) else {}


def verify_requests(canary=None, model="minimax-m3", max_tokens=512, surfaces=("chat", "responses", "messages")):
    """The requests verify sends, as ``[{surface, stream, path, label, body}]``, each in its surface's own shape.

    Without ``canary``: the tool-call canary on every surface, not streamed and streamed. With ``canary`` (the
    ``minimax_surfaces`` verdict): one tool-result turn per surface that answers the surface's own non-streamed
    tool call the way that API's clients do (chat: the assistant's ``tool_calls`` and a ``tool`` message;
    responses: the ``reasoning`` and ``function_call`` items replayed and a ``function_call_output``; messages:
    the ``thinking`` and ``tool_use`` blocks replayed and a ``tool_result`` block).
    """
    max_tokens = int(max_tokens)
    if canary is None:
        return [_request(s, stream, model, max_tokens,
                         QUESTION if s == "responses" else [{"role": "user", "content": QUESTION}])
                for s in surfaces for stream in (False, True)]
    requests = []
    replies = (canary or {}).get("replies", {})
    for surface in surfaces:
        reply = replies.get(surface) or {}
        call = reply.get("tool_call") or {}
        name, arguments = call.get("name") or TOOL["name"], call.get("arguments") or {}
        call_id = reply.get("call_id") or "call_0"
        reasoning = reply.get("reasoning") or ""
        if surface == "chat":
            history = [
                {"role": "user", "content": QUESTION},
                {"role": "assistant", "content": "", "tool_calls": [{
                    "id": call_id, "type": "function",
                    "function": {"name": name, "arguments": _arguments_text(arguments)}}]},
                {"role": "tool", "tool_call_id": call_id, "content": TOOL_RESULT},
            ]
        elif surface == "responses":
            history = [{"role": "user", "content": QUESTION}]
            if reasoning:
                history.append({"type": "reasoning", "summary": [],
                                "content": [{"type": "reasoning_text", "text": reasoning}]})
            history += [
                {"type": "function_call", "call_id": call_id, "name": name, "arguments": _arguments_text(arguments)},
                {"type": "function_call_output", "call_id": call_id, "output": TOOL_RESULT},
            ]
        else:
            blocks = [{"type": "thinking", "thinking": reasoning, "signature": ""}] if reasoning else []
            blocks.append({"type": "tool_use", "id": call_id, "name": name, "input": _arguments_object(arguments)})
            history = [
                {"role": "user", "content": QUESTION},
                {"role": "assistant", "content": blocks},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id, "content": TOOL_RESULT}]},
            ]
        requests.append(_request(surface, False, model, max_tokens, history,
                                 label="%s tool-result turn" % SURFACES[surface]["path"]))
    return requests


#: What verify asks without tools: the plain question (chat completions, not streamed).
PLAIN_QUESTION = "Say hello in one short sentence."
USER_AGENT = "minimax-spark-verify/1.0"


def plain_request(model="minimax-m3", max_tokens=512):
    """The plain question, labelled ``chat`` (its markup check allows a tool call written as text)."""
    return {"surface": "chat", "stream": False, "path": SURFACES["chat"]["path"], "label": "chat",
            "body": {"model": model, "messages": [{"role": "user", "content": PLAIN_QUESTION}],
                     "max_tokens": int(max_tokens), "temperature": 0}}


def headers_for(surface, api_key=""):
    """What each API's clients send: chat and Responses a bearer token, Anthropic clients the key as x-api-key and
    the API version."""
    if surface == "messages":
        return dict({"anthropic-version": "2023-06-01"}, **({"x-api-key": api_key} if api_key else {}))
    return {"Authorization": "Bearer " + api_key} if api_key else {}


def _reason(exc):
    """The useful part of a requests error: ``Connection refused``, ``Read timed out. (read timeout=600)``."""
    text = str(exc)
    errno = re.search(r"\[Errno -?\d+\] ([^'\")]+)", text)
    if errno:
        return errno.group(1).strip()
    return re.sub(r"^\w*ConnectionPool\([^)]*\): ", "", text) or type(exc).__name__


def make_canary_session():
    """A requests session that retries a refused connection once and never re-sends a POST that reached the
    server (make_session retries statuses and read errors on GET/HEAD only). Each request has a connection of its
    own (``Connection: close``): llama-server closes an idle keep-alive connection after a few seconds, and a POST
    sent on such a pooled connection fails with ``RemoteDisconnected`` although the server is well."""
    session = make_session(pool_size=4, retries=1)
    session.headers["User-Agent"] = USER_AGENT
    session.headers["Connection"] = "close"
    return session


def send(session, base_url, request, api_key="", timeout=600):
    """POST one request (``verify_requests``' shape) and return the reply as ``{status, content, json, msg}``:
    ``status`` -1 when nothing answered; a stream cut short keeps what arrived (its verdict names it)."""
    url = (base_url or "").rstrip("/") + request["path"]
    try:
        response = session.post(url, json=request["body"], headers=headers_for(request["surface"], api_key),
                                timeout=timeout, stream=bool(request["stream"]))
    except requests.RequestException as exc:
        return {"status": -1, "msg": _reason(exc)}
    result, chunks = {"status": response.status_code}, []
    try:
        for chunk in response.iter_content(chunk_size=None):
            chunks.append(chunk)
    except requests.RequestException as exc:
        result["msg"] = "the connection broke mid-reply: %s" % _reason(exc)
    finally:
        response.close()
    result["content"] = b"".join(chunks).decode("utf-8", "replace")
    if not request["stream"]:
        try:
            result["json"] = json.loads(result["content"])
        except ValueError:
            pass
    if response.status_code >= 400:
        result.setdefault("msg", "HTTP Error %d: %s" % (response.status_code, response.reason))
    return result


def run(url, api_key="", model="minimax-m3", max_tokens=512, timeout=600, mode="unknown", chat_format="unknown",
        answers=True, session=None):
    """Ask llama-server at ``url`` everything verify asks and judge it.

    First the tool-call canary on every surface, streamed and not; when it passes (and ``answers``), the plain
    question and one tool-result turn per surface answering that surface's own tool call.

    Returns ``{ok, msg, canary, answers, surfaces, tool_call, reasoning, chat, multi_turn, tokens_per_second}``:
    ``canary`` is ``surfaces_verdict``'s (``{ok, kind, msg, tool_call, reasoning, surfaces: {label: verdict}}``),
    ``answers`` is ``answers_verdict``'s (``{ok, msg, answers: {label: text}}``, with ``asked: false`` when the
    canary failed), ``surfaces`` each surface's tool call by label; ``ok``/``msg`` are the first failure's, or the
    canary's pass message.
    """
    session = session or make_canary_session()
    served = dict(mode=mode, chat_format=chat_format, url=url)

    def ask(request):
        return dict(send(session, url, request, api_key, timeout),
                    item={"surface": request["surface"], "stream": request["stream"], "label": request["label"]})

    canary = surfaces_verdict([ask(r) for r in verify_requests(model=model, max_tokens=max_tokens)],
                              max_tokens=max_tokens, **served)
    turns = []
    if canary["ok"] and answers:
        turns = [ask(r) for r in [plain_request(model, max_tokens)] + verify_requests(
            canary, model=model, max_tokens=max_tokens)]
        answered = dict(answers_verdict({t["item"]["label"]: t for t in turns}, **served), asked=True)
    else:
        answered = {"ok": False, "asked": False, "answers": {},
                    "msg": "The plain question and the tool-result turns were not asked: %s" % (
                        "the tool-call canary failed." if not canary["ok"] else "answers is false.")}
    canary.pop("replies", None)
    first = answered if canary["ok"] and answers and not answered["ok"] else canary
    return {
        "ok": canary["ok"] and (answered["ok"] or not answers), "msg": first["msg"],
        "canary": canary, "answers": answered,
        "surfaces": {label: verdict["tool_call"] for label, verdict in canary["surfaces"].items()},
        "tool_call": canary["tool_call"], "reasoning": canary["reasoning"],
        "chat": answered["answers"].get("chat", ""),
        "multi_turn": answered["answers"].get("%s tool-result turn" % SURFACES["chat"]["path"], ""),
        "tokens_per_second": _dig(turns[1:2], 0, "json", "timings", "predicted_per_second"),
    }
