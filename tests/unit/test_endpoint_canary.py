"""The endpoint_canary module against a scripted llama-server: every API asked in its own shape, streamed and not,
the follow-up turns asked only after the canary passed, each failure ending with the project's own message, the key
sent the way each API's clients send it and never shown, and check mode asking all the same (it only reads)."""
import http.server
import json
import threading
import time

import pytest
from test_canary_surfaces import THOUGHT, chat, messages, responses

import endpoint_canary
from helpers import run_module

PATHS = {"/v1/chat/completions": "chat", "/v1/responses": "responses", "/v1/messages": "messages"}
TAIL = "Served: template mode native, chat format peg-minimax-m3, at %s."


def turn_of(surface, body):
    """What the request is: the canary (``stream`` or not), the plain question or the tool-result turn."""
    history = body.get("input") if surface == "responses" else body.get("messages")
    if "tools" not in body:
        return "plain"
    if isinstance(history, list) and len(history) > 1:
        return "result"
    return "streamed" if body.get("stream") else "canary"


def good(surface, turn):
    if turn == "plain":
        return chat(text="Hello there.", calls=(), stop="stop", reasoning="")
    if turn == "result":
        return {"chat": chat(text="It is sunny in Paris.", calls=(), stop="stop"),
                "responses": responses(text="It is sunny in Paris.", calls=()),
                "messages": messages(text="It is sunny in Paris.", calls=(), stop="end_turn")}[surface]
    return {"chat": chat, "responses": responses, "messages": messages}[surface](stream=turn == "streamed")


@pytest.fixture
def server():
    """A llama-server stand-in: ``script[(surface, turn)]`` overrides a reply (a uri-shaped result, or ``"cut"``
    for a stream that stops mid-reply); every request is kept in ``asked``. With ``linger`` (seconds) it keeps a
    connection open that long after each reply and then closes it without reading more, as a server closing an
    idle keep-alive connection does; a request that asks ``Connection: close`` gets it at once, said in the reply."""
    state = {"script": {}, "asked": [], "linger": 0}

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            surface = PATHS[self.path]
            turn = turn_of(surface, body)
            state["asked"].append({"surface": surface, "turn": turn, "body": body, "headers": dict(self.headers)})
            reply = state["script"].get((surface, turn)) or good(surface, turn)
            if reply == "cut":
                text = good(surface, turn)["content"]
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")  # as llama-server streams
                self.end_headers()
                half = text[: len(text) // 2].encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(half), half))  # and never the last chunk
                self.wfile.flush()
                self.close_connection = True
                return
            if "json" in reply:
                reply = dict(reply, json=dict(reply["json"], timings={"predicted_per_second": 42.5}))
            data = (json.dumps(reply["json"]) if "json" in reply else reply.get("content", "")).encode()
            closing = self.headers.get("Connection", "").lower() == "close"
            self.send_response(reply["status"])
            self.send_header("Content-Type", "application/json" if "json" in reply else "text/event-stream")
            self.send_header("Content-Length", str(len(data)))
            if closing:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)
            if state["linger"] and not closing:
                time.sleep(state["linger"])
                self.close_connection = True

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    state["url"] = "http://127.0.0.1:%d" % httpd.server_address[1]
    yield state
    httpd.shutdown()
    httpd.server_close()


def canary(server, check_mode=False, **args):
    return run_module(endpoint_canary.main, dict(dict(url=server["url"], template_mode="native",
                                                      chat_format="peg-minimax-m3", timeout=30), **args),
                      check_mode=check_mode)


@pytest.mark.parametrize("check_mode", [False, True])
def test_every_api_passes_and_each_tool_result_is_answered(server, check_mode):
    result = canary(server, check_mode=check_mode)
    assert result["ok"] and not result["changed"] and "failed" not in result
    assert result["canary"]["msg"] == result["msg"] == (
        'Tool-call canary passed on /v1/chat/completions, /v1/responses, /v1/messages, each streamed and not: '
        'get_weather({"city": "Paris"}). ' + TAIL % server["url"])
    assert result["answers"]["ok"] and result["answers"]["msg"] == (
        "Chat and tool-result answers are clean. " + TAIL % server["url"])
    assert [(a["surface"], a["turn"]) for a in server["asked"]] == [
        ("chat", "canary"), ("chat", "streamed"), ("responses", "canary"), ("responses", "streamed"),
        ("messages", "canary"), ("messages", "streamed"), ("chat", "plain"),
        ("chat", "result"), ("responses", "result"), ("messages", "result")]
    call = {"name": "get_weather", "arguments": {"city": "Paris"}}
    assert result["surfaces"] == {label: call for label in (
        "/v1/chat/completions", "/v1/chat/completions (streamed)", "/v1/responses", "/v1/responses (streamed)",
        "/v1/messages", "/v1/messages (streamed)")}
    assert (result["tool_call"], result["reasoning"]) == (call, THOUGHT)
    assert (result["chat"], result["multi_turn"], result["tokens_per_second"]) == (
        "Hello there.", "It is sunny in Paris.", 42.5)
    assert result["answers"]["answers"] == {
        "chat": "Hello there.", "/v1/chat/completions tool-result turn": "It is sunny in Paris.",
        "/v1/responses tool-result turn": "It is sunny in Paris.",
        "/v1/messages tool-result turn": "It is sunny in Paris."}
    # the tool-result turn answers each API's own call, with its own id, and replays the reasoning where it goes
    turns = {a["surface"]: a["body"] for a in server["asked"] if a["turn"] == "result"}
    assert turns["chat"]["messages"][2]["tool_call_id"] == "c0"
    assert turns["responses"]["input"][1]["content"][0]["text"] == THOUGHT
    assert turns["responses"]["input"][3]["call_id"] == "call_0"
    assert turns["messages"]["messages"][1]["content"][0]["thinking"] == THOUGHT
    assert turns["messages"]["messages"][2]["content"][0]["tool_use_id"] == "tu_0"


def test_a_server_that_closes_idle_connections_is_asked_on_fresh_ones(server):
    """llama-server may close a connection just after a reply: a request sent on it as a reused keep-alive
    connection fails (RemoteDisconnected) although the server is well. Each canary request has its own."""
    server["linger"] = 0.5
    result = canary(server)
    assert result["ok"], result["msg"]
    assert len(server["asked"]) == 10
    assert all(a["headers"]["Connection"] == "close" for a in server["asked"])


def test_the_key_goes_as_each_api_expects_and_is_never_shown(server):
    result = canary(server, api_key="s3cret-key")
    assert result["ok"]
    for asked in server["asked"]:
        if asked["surface"] == "messages":
            assert asked["headers"]["x-api-key"] == "s3cret-key" and asked["headers"]["anthropic-version"]
            assert "Authorization" not in asked["headers"]
        else:
            assert asked["headers"]["Authorization"] == "Bearer s3cret-key"
    assert "s3cret-key" not in json.dumps(result)


def test_a_broken_api_fails_naming_it_and_nothing_more_is_asked(server):
    server["script"][("messages", "streamed")] = messages(stream=True, stop="end_turn")
    result = canary(server)
    assert not result["ok"] and result["canary"]["kind"] == "wrong_stop"
    assert result["msg"] == result["canary"]["msg"]
    assert result["msg"].startswith(
        "Tool-call canary failed on /v1/messages (streamed): stop_reason=end_turn with a tool call, not tool_use "
        "(stop_reason=end_turn, content=[thinking, tool_use], text='', tool_use blocks=1, first call "
        "get_weather({\"city\": \"Paris\"})). Passed: /v1/chat/completions, /v1/chat/completions (streamed), "
        "/v1/responses, /v1/responses (streamed), /v1/messages. " + TAIL % server["url"] + " Fix: agents stop"), \
        result["msg"]
    assert len(server["asked"]) == 6
    assert result["answers"] == {"ok": False, "asked": False, "answers": {}, "msg": (
        "The plain question and the tool-result turns were not asked: the tool-call canary failed.")}
    assert (result["chat"], result["multi_turn"], result["tokens_per_second"]) == ("", "", None)


def test_a_stream_cut_mid_reply_is_named(server):
    server["script"][("chat", "streamed")] = "cut"
    result = canary(server)
    assert not result["ok"] and result["canary"]["kind"] == "stream", result["msg"]
    assert result["msg"].startswith("Tool-call canary failed on /v1/chat/completions (streamed): the stream ended "
                                    "without its last event (finish_reason=None, content='', tool_calls="), \
        result["msg"]


def test_a_tool_result_turn_the_template_cannot_render_fails_the_answers(server):
    error = {"error": {"code": 500, "message": "render failed\nError: Jinja Exception: cannot render reasoning"}}
    server["script"][("responses", "result")] = {"status": 500, "json": error}
    result = canary(server)
    assert result["canary"]["ok"] and not result["answers"]["ok"] and not result["ok"]
    assert result["msg"] == result["answers"]["msg"]
    assert result["msg"].startswith(
        "Verify failed: /v1/responses tool-result turn: HTTP 500 (Jinja Exception: cannot render reasoning). "
        + TAIL % server["url"] + " Fix: a reply of the plain question or of a tool-result turn is wrong"), \
        result["msg"]
    assert result["multi_turn"] == "It is sunny in Paris."


def test_an_endpoint_that_does_not_answer_is_named():
    result = run_module(endpoint_canary.main, dict(url="http://127.0.0.1:9", timeout=5))
    assert not result["ok"] and result["canary"]["kind"] == "unreachable" and "failed" not in result
    assert result["msg"].startswith(
        "Tool-call canary failed on /v1/chat/completions: no answer from http://127.0.0.1:9/v1/chat/completions "
        "(Connection refused). Also failed: /v1/chat/completions (streamed): no answer from "), result["msg"]
    assert "Served: template mode unknown, chat format unknown, at http://127.0.0.1:9. Fix: llama-server is not " \
           "answering" in result["msg"]


def test_answers_false_asks_the_canary_only(server):
    result = canary(server, answers=False)
    assert result["ok"] and len(server["asked"]) == 6
    assert result["msg"].startswith("Tool-call canary passed on ")
    assert not result["answers"]["asked"]
