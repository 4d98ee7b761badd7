"""The canary on the three APIs llama-server serves (chat completions, Responses, Anthropic Messages), streamed
and not: each surface's own reply shape read, every failure kind named with the surface and what came back, and
the requests verify sends in each API's own shape (the tool-result turn answering that API's own tool call).

The replies are built in the shapes this llama.cpp's server writes (tools/server/server-task.cpp), streamed ones
as the server-sent-events body ``send`` returns.
"""
import json

import pytest
from ansible.module_utils.minimax_spark_canary import (
    answers_verdict,
    canary_verdict,
    sse_events,
    surfaces_verdict,
    verify_requests,
)

SERVED = dict(mode="native", chat_format="peg-minimax-m3", url="http://10.0.0.1:8891", max_tokens=512)
TAIL = " Served: template mode native, chat format peg-minimax-m3, at http://10.0.0.1:8891. Fix: "
THOUGHT = "The user asks about the weather in Paris."


def sse(events, done=False):
    """A streamed body: ``events`` are (name or None, data dict)."""
    out = "".join(("event: %s\n" % name if name else "") + "data: %s\n\n" % json.dumps(data) for name, data in events)
    return out + ("data: [DONE]\n\n" if done else "")


# --- replies in each surface's shape -----------------------------------------------------------------

def chat(text="", reasoning=THOUGHT, calls=(("get_weather", '{"city": "Paris"}'),), stop="tool_calls", stream=False,
         complete=True, error=None):
    if not stream:
        message = {"role": "assistant", "content": text, "reasoning_content": reasoning}
        if calls:
            message["tool_calls"] = [{"id": "c%d" % i, "type": "function", "function": {"name": n, "arguments": a}}
                                     for i, (n, a) in enumerate(calls)]
        return {"status": 200, "json": {"choices": [{"message": message, "finish_reason": stop}]}}
    events = [(None, {"choices": [{"delta": {"role": "assistant"}, "finish_reason": None}]})]
    events += [(None, {"choices": [{"delta": {"reasoning_content": part}, "finish_reason": None}]})
               for part in (reasoning[:10], reasoning[10:]) if part]
    if text:
        events.append((None, {"choices": [{"delta": {"content": text}, "finish_reason": None}]}))
    for i, (name, arguments) in enumerate(calls):
        events.append((None, {"choices": [{"delta": {"tool_calls": [
            {"index": i, "id": "c%d" % i, "type": "function", "function": {"name": name, "arguments": ""}}]}}]}))
        for part in (arguments[:5], arguments[5:]):
            part = {"index": i, "function": {"arguments": part}}
            events.append((None, {"choices": [{"delta": {"tool_calls": [part]}}]}))
    if error:
        events.append((None, {"error": {"code": 500, "message": error}}))
    events.append((None, {"choices": [{"delta": {}, "finish_reason": stop}]}))
    return {"status": 200, "content": sse(events, done=complete)}


def responses(text="", reasoning=THOUGHT, calls=(("get_weather", '{"city": "Paris"}'),), stream=False,
              complete=True, output_tokens=30, error=None):
    output = []
    if reasoning:
        output.append({"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": reasoning}]})
    if text:
        output.append({"type": "message", "role": "assistant",
                       "content": [{"type": "output_text", "text": text, "annotations": []}]})
    output += [{"type": "function_call", "id": "fc_%d" % i, "call_id": "call_%d" % i, "name": n, "arguments": a,
                "status": "completed"} for i, (n, a) in enumerate(calls)]
    final = {"object": "response", "status": "completed", "output": output, "usage": {"output_tokens": output_tokens}}
    if not stream:
        return {"status": 200, "json": final}
    events = [("response.created", {"type": "response.created", "response": {"status": "in_progress"}})]
    if reasoning:
        events.append(("response.reasoning_text.delta", {"type": "response.reasoning_text.delta", "delta": reasoning}))
    if text:
        events.append(("response.output_text.delta", {"type": "response.output_text.delta", "delta": text}))
    events += [("response.output_item.done", {"type": "response.output_item.done", "item": item}) for item in output]
    if error:
        events.append(("error", {"type": "error", "message": error}))
    if complete:
        events.append(("response.completed", {"type": "response.completed", "response": final}))
    return {"status": 200, "content": sse(events)}


def messages(text="", reasoning=THOUGHT, calls=(("get_weather", {"city": "Paris"}),), stop="tool_use", stream=False,
             complete=True, error=None):
    blocks = [{"type": "thinking", "thinking": reasoning, "signature": ""}] if reasoning else []
    if text:
        blocks.append({"type": "text", "text": text})
    blocks += [{"type": "tool_use", "id": "tu_%d" % i, "name": n, "input": a} for i, (n, a) in enumerate(calls)]
    if not stream:
        return {"status": 200, "json": {"type": "message", "role": "assistant", "content": blocks, "stop_reason": stop}}
    events = [("message_start", {"type": "message_start", "message": {"content": []}})]
    for index, block in enumerate(blocks):
        kind = block["type"]
        if kind == "tool_use":
            start = {"type": "tool_use", "id": block["id"], "name": block["name"]}
        else:
            start = {"type": kind, kind: ""}
        events.append(("content_block_start", {"type": "content_block_start", "index": index, "content_block": start}))
        if kind == "thinking":
            delta = {"type": "thinking_delta", "thinking": block["thinking"]}
        elif kind == "text":
            delta = {"type": "text_delta", "text": block["text"]}
        else:
            raw = block["input"] if isinstance(block["input"], str) else json.dumps(block["input"])
            delta = {"type": "input_json_delta", "partial_json": raw}
        events.append(("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}))
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    if error:
        events.append(("error", {"type": "error", "error": {"type": "api_error", "message": error}}))
    events.append(("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop}}))
    if complete:
        events.append(("message_stop", {"type": "message_stop"}))
    return {"status": 200, "content": sse(events)}


MAKERS = {"chat": chat, "responses": responses, "messages": messages}
LABEL = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}
ALL = [(surface, stream) for surface in MAKERS for stream in (False, True)]


def label(surface, stream):
    return LABEL[surface] + (" (streamed)" if stream else "")


def verdict(surface, stream, result, **kw):
    return canary_verdict(result, surface=surface, stream=stream, **dict(SERVED, **kw))


# --- passing replies ---------------------------------------------------------------------------------

@pytest.mark.parametrize("surface, stream", ALL)
def test_a_structured_call_with_separate_reasoning_passes_on_every_surface(surface, stream):
    v = verdict(surface, stream, MAKERS[surface](stream=stream))
    assert v["ok"], v["msg"]
    assert v["tool_call"] == {"name": "get_weather", "arguments": {"city": "Paris"}}
    assert v["reasoning"] == THOUGHT and v["content"] == ""
    assert v["msg"] == ('Tool-call canary passed on %s: get_weather({"city": "Paris"}). Served: template mode native, '
                        "chat format peg-minimax-m3, at http://10.0.0.1:8891." % label(surface, stream))


def test_each_surface_keeps_its_own_call_id():
    assert verdict("chat", False, chat())["call_id"] == "c0"
    assert verdict("responses", True, responses(stream=True))["call_id"] == "call_0"
    assert verdict("messages", True, messages(stream=True))["call_id"] == "tu_0"


# --- every failure kind, on every surface --------------------------------------------------------------

SEEN = {
    ("chat", "markup"): "finish_reason=stop, content='<mm:think>x</mm:think>Hi', tool_calls=0",
    ("responses", "markup"): "status=completed, output=[reasoning, message], text='<mm:think>x</mm:think>Hi', "
                             "function_call items=0",
    ("messages", "markup"): "stop_reason=end_turn, content=[thinking, text], text='<mm:think>x</mm:think>Hi', "
                            "tool_use blocks=0",
}


def plain(surface, stream, text):
    """A reply with text and no call, stopped normally."""
    kw = dict(text=text, calls=(), stream=stream)
    if surface == "chat":
        kw["stop"] = "stop"
    elif surface == "messages":
        kw["stop"] = "end_turn"
    return MAKERS[surface](**kw)


@pytest.mark.parametrize("surface, stream", ALL)
def test_markup_in_the_text_is_named_with_the_surface(surface, stream):
    v = verdict(surface, stream, plain(surface, stream, "<mm:think>x</mm:think>Hi"))
    where = "content" if surface == "chat" else "the text"
    assert v["kind"] == "markup"
    assert v["msg"] == ("Tool-call canary failed on %s: tool-call or reasoning markup <mm:think>, </mm:think> in %s "
                        "(%s).%s" % (label(surface, stream), where, SEEN[(surface, "markup")], TAIL)) + (
        "the model writes its tool calls or reasoning in a format the served template's parser does not recognise: "
        "set hybrid_template_mode to the other template (auto tries both), or use a llama.cpp build whose parser "
        "matches the model.")


@pytest.mark.parametrize("surface, stream, what", [
    ("chat", False, "no tool_calls came back (finish_reason=stop, content='Hello', tool_calls=0)"),
    ("chat", True, "no tool_calls came back (finish_reason=stop, content='Hello', tool_calls=0)"),
    ("responses", False, "no function_call items came back (status=completed, output=[reasoning, message], "
                         "text='Hello', function_call items=0)"),
    ("responses", True, "no function_call items came back (status=completed, output=[reasoning, message], "
                        "text='Hello', function_call items=0)"),
    ("messages", False, "no tool_use blocks came back (stop_reason=end_turn, content=[thinking, text], text='Hello', "
                        "tool_use blocks=0)"),
    ("messages", True, "no tool_use blocks came back (stop_reason=end_turn, content=[thinking, text], text='Hello', "
                       "tool_use blocks=0)"),
])
def test_no_call_names_the_surfaces_own_shape(surface, stream, what):
    v = verdict(surface, stream, plain(surface, stream, "Hello"))
    assert v["kind"] == "no_tool_calls"
    assert v["msg"].startswith("Tool-call canary failed on %s: %s.%s" % (label(surface, stream), what, TAIL)), v["msg"]


@pytest.mark.parametrize("surface, stream", ALL)
def test_another_tool_is_named(surface, stream):
    args = {"city": "Paris"} if surface == "messages" else '{"city": "Paris"}'
    v = verdict(surface, stream, MAKERS[surface](calls=(("get_time", args),), stream=stream))
    assert v["kind"] == "wrong_name"
    what = "the tool call names 'get_time', not 'get_weather' ("
    assert "Tool-call canary failed on %s: %s" % (label(surface, stream), what) in v["msg"]


@pytest.mark.parametrize("surface, stream, arguments, what", [
    ("chat", False, '{"city": ', "arguments are not JSON (Expecting value: line 1 column 10 (char 9))"),
    ("chat", True, '["Paris"]', "arguments are a JSON list, not an object"),
    ("chat", False, "{}", "arguments lack the required 'city'"),
    ("responses", False, '{"city": ', "arguments are not JSON (Expecting value: line 1 column 10 (char 9))"),
    ("responses", True, "{}", "arguments lack the required 'city'"),
    # llama-server turns arguments it cannot parse into an empty input: the required key tells
    ("messages", False, {}, "input lacks the required 'city'"),
    ("messages", True, '{"city": ', "input is not JSON (Expecting value: line 1 column 10 (char 9))"),
    ("messages", False, ["Paris"], "input is a JSON list, not an object"),
])
def test_bad_arguments_are_named(surface, stream, arguments, what):
    v = verdict(surface, stream, MAKERS[surface](calls=(("get_weather", arguments),), stream=stream))
    assert v["kind"] == "bad_arguments"
    assert v["msg"].startswith("Tool-call canary failed on %s: %s (" % (label(surface, stream), what)), v["msg"]
    assert v["msg"].endswith("Fix: the tool call's arguments are not a JSON object: the parser and the model's format "
                             "disagree (set hybrid_template_mode to the other template) or the GGUF is corrupt.")


@pytest.mark.parametrize("surface, stream, result, what", [
    ("chat", False, chat(stop="length", calls=(("get_weather", '{"ci'),)),
     "cut at max_tokens=512 (finish_reason=length, content='', tool_calls=1, first call get_weather({\"ci))"),
    ("chat", True, chat(stop="length", calls=(), stream=True),
     "cut at max_tokens=512 (finish_reason=length, content='', tool_calls=0)"),
    ("responses", False, responses(calls=(), output_tokens=512),
     "cut at max_tokens=512 (status=completed, output=[reasoning], text='', function_call items=0)"),
    ("responses", True, responses(calls=(), output_tokens=600, stream=True),
     "cut at max_tokens=512 (status=completed, output=[reasoning], text='', function_call items=0)"),
    ("messages", False, messages(stop="max_tokens", calls=()),
     "cut at max_tokens=512 (stop_reason=max_tokens, content=[thinking], text='', tool_use blocks=0)"),
    ("messages", True, messages(stop="max_tokens", calls=(), stream=True),
     "cut at max_tokens=512 (stop_reason=max_tokens, content=[thinking], text='', tool_use blocks=0)"),
])
def test_a_reply_cut_at_max_tokens_is_named(surface, stream, result, what):
    v = verdict(surface, stream, result)
    assert v["kind"] == "length"
    assert v["msg"].startswith("Tool-call canary failed on %s: %s.%s" % (label(surface, stream), what, TAIL)), v["msg"]


@pytest.mark.parametrize("surface, stop, what", [
    ("chat", "stop", "finish_reason=stop with a tool call, not tool_calls"),
    ("messages", "end_turn", "stop_reason=end_turn with a tool call, not tool_use"),
])
@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_call_with_the_wrong_stop_reason_is_named(surface, stop, what, stream):
    v = verdict(surface, stream, MAKERS[surface](stop=stop, stream=stream))
    assert v["kind"] == "wrong_stop"
    assert v["msg"].startswith("Tool-call canary failed on %s: %s (" % (label(surface, stream), what)), v["msg"]
    assert "Fix: agents stop at a reply whose stop reason is not the tool call's" in v["msg"]


@pytest.mark.parametrize("surface", list(MAKERS))
def test_a_stream_cut_short_or_carrying_an_error_is_named(surface):
    v = verdict(surface, True, MAKERS[surface](stream=True, complete=False))
    assert v["kind"] == "stream"
    assert v["msg"].startswith("Tool-call canary failed on %s (streamed): the stream ended without its last event ("
                               % LABEL[surface]), v["msg"]
    v = verdict(surface, True, MAKERS[surface](stream=True, error="boom"))
    assert v["kind"] == "stream"
    assert "Tool-call canary failed on %s (streamed): the stream carried an error (" % LABEL[surface] in v["msg"]
    assert "boom" in v["msg"] and "Fix: read llama-server's log for the error at that time" in v["msg"]


@pytest.mark.parametrize("surface, stream", ALL)
def test_http_errors_and_no_answer_are_named(surface, stream):
    v = verdict(surface, stream, {"status": -1, "msg": "Connection refused"})
    assert v["kind"] == "unreachable"
    assert v["msg"].startswith("Tool-call canary failed on %s: no answer from http://10.0.0.1:8891%s (Connection "
                               "refused)." % (label(surface, stream), LABEL[surface]))
    v = verdict(surface, stream, {"status": 404, "content": '{"error":{"code":404,"message":"File Not Found"}}'})
    assert v["kind"] == "http"
    assert v["msg"].startswith("Tool-call canary failed on %s: HTTP 404 (File Not Found).%s"
                               % (label(surface, stream), TAIL))
    assert "HTTP 404 that this llama.cpp build does not serve that API (build a newer one)" in v["msg"]
    # HTTP 200 with nothing of the surface's shape
    assert verdict(surface, stream, {"status": 200, "content": ""})["kind"] == "http"


def test_a_template_exception_shows_llama_servers_last_error_line():
    body = json.dumps({"error": {"code": 500, "message": "\n------------\nWhile executing CallExpression at line 163"
                                 "\nError: Jinja Exception: cannot render reasoning", "type": "server_error"}})
    v = verdict("messages", False, {"status": 500, "content": body, "msg": "Status code was 500"})
    assert v["msg"].startswith("Tool-call canary failed on /v1/messages: HTTP 500 (Jinja Exception: cannot render "
                               "reasoning).")


# --- all surfaces at once ----------------------------------------------------------------------------------

def looped(replies):
    """The looped uri task's registered result: each reply with the request it answers as ``item``."""
    return {"results": [dict(reply, item={"surface": s, "stream": st}) for (s, st), reply in replies.items()]}


def good():
    return {(s, st): MAKERS[s](stream=st) for s, st in ALL}


def test_all_surfaces_pass_in_one_message():
    v = surfaces_verdict(looped(good()), **SERVED)
    assert v["ok"] and v["kind"] == "ok"
    assert v["msg"] == ('Tool-call canary passed on /v1/chat/completions, /v1/responses, /v1/messages, each '
                        'streamed and not: get_weather({"city": "Paris"}). Served: template mode native, chat format '
                        "peg-minimax-m3, at http://10.0.0.1:8891.")
    assert v["tool_call"] == {"name": "get_weather", "arguments": {"city": "Paris"}}
    assert v["reasoning"] == THOUGHT
    assert sorted(v["replies"]) == ["chat", "messages", "responses"]
    assert v["replies"]["messages"]["call_id"] == "tu_0"


def test_one_broken_surface_is_named_with_what_passed():
    replies = good()
    replies[("messages", True)] = messages(stream=True, stop="end_turn")
    v = surfaces_verdict(looped(replies), **SERVED)
    assert not v["ok"] and v["kind"] == "wrong_stop"
    assert v["msg"].startswith(
        "Tool-call canary failed on /v1/messages (streamed): stop_reason=end_turn with a tool call, not tool_use "
        "(stop_reason=end_turn, content=[thinking, tool_use], text='', tool_use blocks=1, first call "
        "get_weather({\"city\": \"Paris\"})). Passed: /v1/chat/completions, /v1/chat/completions (streamed), "
        "/v1/responses, /v1/responses (streamed), /v1/messages." + TAIL), v["msg"]


def test_several_broken_surfaces_are_all_named_the_first_decides_the_fix():
    replies = good()
    replies[("chat", True)] = chat(stream=True, calls=(), text="Hi", stop="stop")
    replies[("responses", False)] = {"status": 404, "content": "File Not Found"}
    v = surfaces_verdict(looped(replies), **SERVED)
    assert v["kind"] == "no_tool_calls"
    assert v["msg"].startswith(
        "Tool-call canary failed on /v1/chat/completions (streamed): no tool_calls came back (finish_reason=stop, "
        "content='Hi', tool_calls=0). Also failed: /v1/responses: HTTP 404 (File Not Found). Passed: "
        "/v1/chat/completions, /v1/responses (streamed), /v1/messages, /v1/messages (streamed)." + TAIL + "the model "
        "answered in text"), v["msg"]


def test_nothing_sent_is_a_failure():
    assert not surfaces_verdict({"results": []}, **SERVED)["ok"]


# --- the requests verify sends ----------------------------------------------------------------------------

def test_the_canary_asks_every_surface_in_its_own_shape_streamed_and_not():
    reqs = verify_requests(model="m", max_tokens=64)
    assert [(r["path"], r["stream"], r["label"]) for r in reqs] == [
        ("/v1/chat/completions", False, "/v1/chat/completions"),
        ("/v1/chat/completions", True, "/v1/chat/completions (streamed)"),
        ("/v1/responses", False, "/v1/responses"), ("/v1/responses", True, "/v1/responses (streamed)"),
        ("/v1/messages", False, "/v1/messages"), ("/v1/messages", True, "/v1/messages (streamed)")]
    chat_body, resp_body, msg_body = reqs[0]["body"], reqs[2]["body"], reqs[4]["body"]
    assert chat_body["tools"][0]["function"]["name"] == "get_weather" and chat_body["max_tokens"] == 64
    assert resp_body["tools"][0]["type"] == "function" and resp_body["tools"][0]["name"] == "get_weather"
    assert resp_body["max_output_tokens"] == 64 and isinstance(resp_body["input"], str)
    assert msg_body["tools"][0]["input_schema"]["required"] == ["city"] and msg_body["max_tokens"] == 64
    assert all(r["body"]["temperature"] == 0 and r["body"]["model"] == "m" for r in reqs)


def test_the_tool_result_turn_answers_each_surfaces_own_call_and_replays_its_reasoning():
    canary = surfaces_verdict(looped(good()), **SERVED)
    chat_turn, resp_turn, msg_turn = verify_requests(canary, model="m", max_tokens=64)
    assert chat_turn["label"] == "/v1/chat/completions tool-result turn"
    assert chat_turn["body"]["messages"][1]["tool_calls"][0]["id"] == "c0"
    assert chat_turn["body"]["messages"][2] == {"role": "tool", "tool_call_id": "c0", "content": (
        '{"city": "Paris", "forecast": "sunny", "temperature_c": 21}')}
    assert [i.get("type") for i in resp_turn["body"]["input"]] == [None, "reasoning", "function_call",
                                                                   "function_call_output"]
    assert resp_turn["body"]["input"][1]["content"][0]["text"] == THOUGHT
    assert resp_turn["body"]["input"][2]["call_id"] == resp_turn["body"]["input"][3]["call_id"] == "call_0"
    assert json.loads(resp_turn["body"]["input"][2]["arguments"]) == {"city": "Paris"}
    assistant, result = msg_turn["body"]["messages"][1:]
    assert assistant["content"][0] == {"type": "thinking", "thinking": THOUGHT, "signature": ""}
    assert assistant["content"][1] == {"type": "tool_use", "id": "tu_0", "name": "get_weather",
                                       "input": {"city": "Paris"}}
    assert result["content"][0]["tool_use_id"] == "tu_0" and result["content"][0]["type"] == "tool_result"


def test_the_tool_result_answers_are_judged_per_surface():
    turns = [dict(chat(text="It is sunny.", calls=(), stop="stop"), item={"surface": "chat", "label": "A"}),
             dict(responses(text="It is sunny.", calls=()), item={"surface": "responses", "label": "B"}),
             dict(messages(text="<mm:think>x", calls=(), stop="end_turn"), item={"surface": "messages", "label": "C"})]
    served = {k: SERVED[k] for k in ("mode", "chat_format", "url")}
    v = answers_verdict({t["item"]["label"]: t for t in turns}, **served)
    assert not v["ok"]
    assert v["answers"] == {"A": "It is sunny.", "B": "It is sunny.", "C": "<mm:think>x"}
    assert v["msg"].startswith("Verify failed: C: markup <mm:think> in the text '<mm:think>x'." + TAIL
                               + "a reply of the plain question or of a tool-result turn is wrong"), v["msg"]
    turns[2] = dict({"status": 500, "content": json.dumps({"error": {"message": "x\nError: Jinja Exception: no"}})},
                    item={"surface": "messages", "label": "C"})
    v = answers_verdict({t["item"]["label"]: t for t in turns})
    assert v["msg"].startswith("Verify failed: C: HTTP 500 (Jinja Exception: no). Served:"), v["msg"]


def test_sse_events_reads_names_json_and_done():
    body = 'event: a\ndata: {"x": 1}\n\ndata: [DONE]\n\n: comment\n\nevent: b\r\ndata: not json\r\n\r\n'
    assert sse_events(body) == [("a", {"x": 1}), (None, "[DONE]"), ("b", "not json")]
    assert sse_events(None) == []


# --- the reasoning, where each surface's clients read it ----------------------------------------------------

REASONING_FIX = (
    "clients read M3's reasoning only from that field (chat: reasoning_content; Responses: the reasoning "
    "item; Messages: the thinking block) and send it back with the next turn, so llama-server must split it out of "
    "the text: take --reasoning-format none (or deepseek-legacy) and whatever turns thinking off (thinking_mode or "
    "enable_thinking in --chat-template-kwargs, --reasoning-budget 0) out of head_server_extra_args; thinking markup "
    "in the text means the served template's parser does not read the model's thinking tags (set "
    "hybrid_template_mode to the other template, auto tries both).")
CALLED = {
    "chat": "finish_reason=tool_calls, content=%s, tool_calls=1, first call get_weather({\"city\": \"Paris\"})",
    "responses": "status=completed, output=[%sfunction_call], text=%s, function_call items=1, first call "
                 "get_weather({\"city\": \"Paris\"})",
    "messages": "stop_reason=tool_use, content=[%stool_use], text=%s, tool_use blocks=1, first call "
                "get_weather({\"city\": \"Paris\"})",
}
FIELD = {"chat": "reasoning_content", "responses": "a reasoning output item", "messages": "a thinking block"}


@pytest.mark.parametrize("surface, stream", ALL)
def test_a_call_without_reasoning_in_the_surfaces_field_fails(surface, stream):
    """A structured call whose reply has no reasoning where the API's clients read it (reasoning_content, the
    reasoning item, the thinking block) is a failure, not a pass: "no markup in the text" is not enough."""
    v = verdict(surface, stream, MAKERS[surface](reasoning="", stream=stream))
    seen = CALLED[surface] % ("''",) if surface == "chat" else CALLED[surface] % ("", "''")
    assert not v["ok"] and v["kind"] == "no_reasoning"
    assert v["msg"] == "Tool-call canary failed on %s: no reasoning in %s (%s).%s%s" % (
        label(surface, stream), FIELD[surface], seen, TAIL, REASONING_FIX), v["msg"]


@pytest.mark.parametrize("surface, stream", ALL)
def test_reasoning_left_in_the_text_is_named_as_reasoning_not_in_its_field(surface, stream):
    """What llama-server's --reasoning-format none serves: the thought in the text as <mm:think>...</mm:think>, the
    call parsed, the reasoning field empty."""
    text = "<mm:think>%s</mm:think>" % THOUGHT
    v = verdict(surface, stream, MAKERS[surface](reasoning="", text=text, stream=stream))
    excerpt = repr(text)
    if surface == "chat":
        seen = CALLED["chat"] % excerpt
    else:
        seen = CALLED[surface] % ("message, " if surface == "responses" else "text, ", excerpt)
    where = "content" if surface == "chat" else "the text"
    assert v["kind"] == "no_reasoning"
    assert v["msg"] == ("Tool-call canary failed on %s: the reasoning is not in %s: thinking markup <mm:think>, "
                        "</mm:think> in %s (%s).%s%s" % (label(surface, stream), FIELD[surface], where, seen, TAIL,
                                                        REASONING_FIX)), v["msg"]


def test_streamed_reasoning_deltas_without_the_reasoning_item_fail():
    """A Responses client shows the deltas but keeps (and sends back) the reasoning item: the item must be there."""
    result = responses(stream=True)
    events = [(name, data) for name, data in sse_events(result["content"])
              if not (name == "response.output_item.done" and data["item"]["type"] == "reasoning")]
    for _, data in events:
        if data.get("type") == "response.completed":
            data["response"]["output"] = [i for i in data["response"]["output"] if i["type"] != "reasoning"]
    v = verdict("responses", True, {"status": 200, "content": sse(events)})
    assert v["kind"] == "no_reasoning"
    assert v["msg"].startswith("Tool-call canary failed on /v1/responses (streamed): no reasoning in a reasoning "
                               "output item (status=completed, output=[function_call], "), v["msg"]


def test_one_surface_without_reasoning_fails_the_canary_naming_it():
    replies = good()
    replies[("messages", False)] = messages(reasoning="")
    v = surfaces_verdict(looped(replies), **SERVED)
    assert not v["ok"] and v["kind"] == "no_reasoning"
    assert v["msg"].startswith(
        "Tool-call canary failed on /v1/messages: no reasoning in a thinking block (stop_reason=tool_use, "
        "content=[tool_use], text='', tool_use blocks=1, first call get_weather({\"city\": \"Paris\"})). Passed: "
        "/v1/chat/completions, /v1/chat/completions (streamed), /v1/responses, /v1/responses (streamed), "
        "/v1/messages (streamed)." + TAIL + "clients read M3's reasoning only from that field"), v["msg"]
