"""The verify role's verdicts, computed from the uri results so that a failure always ends with the
project's own message (never with a template error on data that is missing from the reply)."""

from __future__ import annotations

import json

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
        "HTTP 5xx that the template fails to render or the model is broken"
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


def _served(mode, chat_format, url):
    return "template mode %s, chat format %s, at %s" % (mode or "unknown", chat_format or "unknown", url or "?")


def canary_verdict(result, mode="", chat_format="", url="", max_tokens=None, tool_name="get_weather"):
    """Verdict of the tool-call canary from the ``uri`` task's registered ``result``.

    Returns ``{ok, kind, msg, status, finish_reason, content, tool_call}``: ``kind`` is ``ok`` or one of
    FIXES' keys; ``msg`` says what came back, what was served and what to do (the pass message on success).
    """
    result = result if isinstance(result, dict) else {}
    status = result.get("status", -1)
    try:
        status = int(status)
    except (TypeError, ValueError):
        status = -1
    body = result.get("json")
    message = _dig(body, "choices", 0, "message") or {}
    finish_reason = _dig(body, "choices", 0, "finish_reason")
    content = message.get("content") if isinstance(message, dict) else None
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    calls = calls if isinstance(calls, list) else []
    first = calls[0] if calls and isinstance(calls[0], dict) else {}
    name = _dig(first, "function", "name")
    arguments = _dig(first, "function", "arguments")
    verdict = {
        "ok": False, "status": status, "finish_reason": finish_reason,
        "content": content if isinstance(content, str) else "",
        "tool_call": {"name": name, "arguments": arguments} if calls else {},
    }
    served = _served(mode, chat_format, url)
    seen = "finish_reason=%s, content=%r, tool_calls=%d%s" % (
        finish_reason, _excerpt(content), len(calls),
        (", first call %s(%s)" % (name, _excerpt(arguments))) if calls else "")

    def fail(kind, what):
        verdict.update(kind=kind, msg="Tool-call canary failed: %s. Served: %s. Fix: %s." % (what, served, FIXES[kind]))
        return verdict

    if status == -1:
        return fail("unreachable", "no answer from %s/v1/chat/completions (%s)" % (
            url or "?", _excerpt(result.get("msg", "connection failed"))))
    if status != 200 or not isinstance(body, dict):
        return fail("http", "HTTP %s (%s)" % (status, _excerpt(result.get("content") or result.get("msg") or body)))
    if finish_reason == "length":
        return fail("length", "cut at max_tokens=%s (%s)" % (max_tokens if max_tokens is not None else "?", seen))
    found = markup_in(content)
    if found:
        return fail("markup", "tool-call or reasoning markup %s in content (%s)" % (", ".join(found), seen))
    if not calls:
        return fail("no_tool_calls", "no tool_calls came back (%s)" % seen)
    if name != tool_name:
        return fail("wrong_name", "the tool call names %r, not %r (%s)" % (name, tool_name, seen))
    parsed = arguments
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except ValueError as exc:
            return fail("bad_arguments", "arguments are not JSON (%s) (%s)" % (exc, seen))
    if not isinstance(parsed, dict):
        return fail("bad_arguments", "arguments are a JSON %s, not an object (%s)" % (type(parsed).__name__, seen))
    verdict.update(
        ok=True, kind="ok", tool_call={"name": name, "arguments": parsed},
        msg="Tool-call canary passed: %s(%s). Served: %s." % (name, json.dumps(parsed, sort_keys=True), served))
    return verdict


def answers_verdict(replies, mode="", chat_format="", url=""):
    """Problems of the other replies (``{label: uri result}``): HTTP errors, empty answers, markup in content
    (reasoning markup only for ``chat``, the question asked without tools).

    Returns ``{ok, msg}``.
    """
    problems = []
    for label, result in (replies or {}).items():
        result = result if isinstance(result, dict) else {}
        status = result.get("status", -1)
        message = _dig(result.get("json"), "choices", 0, "message")
        if status != 200 or not isinstance(message, dict):
            problems.append("%s: HTTP %s (%s)" % (label, status, _excerpt(result.get("msg") or result.get("content"))))
            continue
        content = message.get("content") or ""
        found = markup_in(content, REASONING_MARKUP if label == "chat" else MARKUP)
        if found:
            problems.append("%s: markup %s in content %r" % (label, ", ".join(found), _excerpt(content)))
        elif not content and not message.get("reasoning_content") and not message.get("tool_calls"):
            problems.append("%s: empty answer (finish_reason=%s)" % (
                label, _dig(result.get("json"), "choices", 0, "finish_reason")))
    if not problems:
        served = _served(mode, chat_format, url)
        return {"ok": True, "msg": "Chat and multi-turn answers are clean. Served: %s." % served}
    return {"ok": False, "msg": "Verify failed: %s. Served: %s. Fix: %s." % (
        "; ".join(problems), _served(mode, chat_format, url), FIXES["markup"])}


def head_settings(settings, server_options=None):
    """Problems of head_server's settings (``{port, ctx_size, ..., extra_args}`` without the prefix), each a
    sentence naming the variable; empty when they are fine. ``server_options`` (the build manifest's list of
    llama-server's long options) makes unknown ``--flags`` in extra_args a problem too."""
    problems = []

    def number(key):
        value = settings.get(key)
        if isinstance(value, bool):
            return None
        try:
            return int(str(value).strip())
        except (TypeError, ValueError):
            problems.append("head_server_%s=%r is not a whole number" % (key, value))
            return None

    if "port" in settings:
        port = number("port")
        if port is not None and not 1 <= port <= 65535:
            problems.append("head_server_port=%d is not a port (1-65535)" % port)
    if "ctx_size" in settings:
        ctx = number("ctx_size")
        if ctx is not None and ctx < 0:
            problems.append("head_server_ctx_size=%d is negative (0 takes the model's own context)" % ctx)
    for key in ("parallel", "batch_size", "ubatch_size", "health_timeout", "health_interval"):
        if key in settings:
            value = number(key)
            if value is not None and value < 1:
                problems.append("head_server_%s=%d must be positive" % (key, value))
    extra = settings.get("extra_args", [])
    if isinstance(extra, str) or not isinstance(extra, (list, tuple)):
        problems.append(
            "head_server_extra_args is %r, not a list of strings: give a list, e.g. "
            "-e '{\"head_server_extra_args\": [\"--flag\", \"value\"]}'" % (_excerpt(extra, 60),))
    else:
        known = set(server_options or [])
        for arg in extra:
            if not isinstance(arg, (str, int, float)) or isinstance(arg, bool):
                problems.append("head_server_extra_args holds %r, not a string" % (arg,))
                continue
            flag = str(arg).split("=", 1)[0]
            if known and flag.startswith("--") and len(flag) > 2 and flag not in known:
                problems.append("%s in head_server_extra_args is not an option of this llama-server "
                                "(see llama-server --help)" % flag)
    return problems


class FilterModule:
    def filters(self):
        return {
            "minimax_canary": canary_verdict,
            "minimax_answers": answers_verdict,
            "minimax_head_settings": head_settings,
        }
