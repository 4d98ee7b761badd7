"""The demo deployment as coding agents use it: the official ``openai`` and ``anthropic`` packages against the
three APIs llama-server serves (chat completions, Responses, Anthropic Messages), streamed and not, each with a
tool-result turn, reasoning kept in its own field.

The demo's model is scripted (tools/make_tiny_m3.py): a thought and one ``get_weather(city="Paris")`` call, and
after a tool result another thought and "It is sunny in Paris.". Clients are configured as the README's "Use it
from an agent" section says: base URL ``http://HEAD:8891/v1`` for OpenAI clients, ``http://HEAD:8891`` for
Anthropic clients, model ``minimax-m3``.
"""
import json
import time

import anthropic
import openai
import pytest
import requests
from ansible.module_utils.minimax_spark_canary import MARKUP
from test_demo import API, deployed, serving_argv, task_result  # noqa: F401  (the demo deployment, shared fixtures)

import make_tiny_m3 as tiny
from helpers import failed_tasks, run_playbook

MODEL = "minimax-m3"
QUESTION = "What is the weather in Paris? Use the get_weather tool."
RESULT = json.dumps({"city": "Paris", "forecast": "sunny", "temperature_c": 21})
PARAMETERS = {"type": "object", "properties": {"city": {"type": "string", "description": "The city name."}},
              "required": ["city"]}
DESCRIPTION = "Get the current weather for a city."
#: temperature 0 (anthropic 2.x has no temperature argument; the API still takes it)
GREEDY = {"temperature": 0}


def assert_clean(text):
    """Reasoning and tool-call markup never reach what a client shows as the answer."""
    assert not [m for m in MARKUP if m in (text or "")], text


@pytest.fixture(scope="module")
def oai(deployed):  # noqa: F811
    return openai.OpenAI(base_url=API + "/v1", api_key="no-key", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def claude(deployed):  # noqa: F811
    return anthropic.Anthropic(base_url=API, api_key="no-key", max_retries=0, timeout=120)


def test_verify_proved_every_api_streamed_and_not(deployed):  # noqa: F811
    """What site.yml's verify step reports: the same call from each API and mode, the tool result answered on each."""
    said = [e["event_data"]["res"].get("msg") for e in deployed.event_list
            if e.get("event") == "runner_on_ok" and e["event_data"].get("task") == "Report the canary"]
    assert said == ['Tool-call canary passed on /v1/chat/completions, /v1/responses, /v1/messages, each streamed and '
                    'not: get_weather({"city": "Paris"}). Served: template mode native, chat format peg-minimax-m3, '
                    "at http://127.0.0.1:8891."]
    results = task_result(deployed, "Summarise the verification")["ansible_facts"]["verify_results"]
    call = {"name": tiny.TOOL_NAME, "arguments": {"city": "Paris"}}
    assert results["surfaces"] == {label: call for label in (
        "/v1/chat/completions", "/v1/chat/completions (streamed)", "/v1/responses", "/v1/responses (streamed)",
        "/v1/messages", "/v1/messages (streamed)")}
    assert results["tool_result_answers"] == {
        "/v1/chat/completions tool-result turn": tiny.ANSWER, "/v1/responses tool-result turn": tiny.ANSWER,
        "/v1/messages tool-result turn": tiny.ANSWER}
    assert results["reasoning"] == tiny.THOUGHT_CALL


# --- /v1/chat/completions (OpenCode, Cline, most agents) ------------------------------------------------

CHAT_TOOLS = [{"type": "function", "function": {"name": tiny.TOOL_NAME, "description": DESCRIPTION,
                                                 "parameters": PARAMETERS}}]


def chat_streamed(oai, messages):
    """Accumulate a streamed chat completion as clients do: content, reasoning_content, tool-call deltas."""
    text, reasoning, calls, finish = "", "", {}, None
    for chunk in oai.chat.completions.create(model=MODEL, messages=messages, tools=CHAT_TOOLS, temperature=0,
                                             max_tokens=512, stream=True):
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        delta = choice.delta
        text += delta.content or ""
        reasoning += getattr(delta, "reasoning_content", None) or ""
        for part in delta.tool_calls or []:
            call = calls.setdefault(part.index, {"id": None, "name": "", "arguments": ""})
            call["id"] = part.id or call["id"]
            if part.function:
                call["name"] += part.function.name or ""
                call["arguments"] += part.function.arguments or ""
    return text, reasoning, [calls[i] for i in sorted(calls)], finish


def test_chat_completions_tool_call_reasoning_and_tool_result(oai):
    first = [{"role": "user", "content": QUESTION}]
    reply = oai.chat.completions.create(model=MODEL, messages=first, tools=CHAT_TOOLS, temperature=0, max_tokens=512)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert (call.type, call.function.name, json.loads(call.function.arguments)) == (
        "function", tiny.TOOL_NAME, {"city": "Paris"})
    assert choice.message.reasoning_content == tiny.THOUGHT_CALL
    assert not choice.message.content
    # the tool-result turn, as a chat client sends it
    history = first + [
        {"role": "assistant", "content": "", "tool_calls": [call.model_dump(exclude_none=True)]},
        {"role": "tool", "tool_call_id": call.id, "content": RESULT},
    ]
    answer = oai.chat.completions.create(model=MODEL, messages=history, tools=CHAT_TOOLS, temperature=0, max_tokens=512)
    assert answer.choices[0].finish_reason == "stop"
    assert answer.choices[0].message.content == tiny.ANSWER
    assert answer.choices[0].message.reasoning_content == tiny.THOUGHT_ANSWER
    assert not answer.choices[0].message.tool_calls


def test_chat_completions_streamed(oai):
    text, reasoning, calls, finish = chat_streamed(oai, [{"role": "user", "content": QUESTION}])
    assert finish == "tool_calls" and reasoning == tiny.THOUGHT_CALL and text == ""
    assert len(calls) == 1 and calls[0]["id"]
    assert (calls[0]["name"], json.loads(calls[0]["arguments"])) == (tiny.TOOL_NAME, {"city": "Paris"})
    history = [{"role": "user", "content": QUESTION},
               {"role": "assistant", "content": "", "reasoning_content": reasoning, "tool_calls": [
                   {"id": calls[0]["id"], "type": "function",
                    "function": {"name": calls[0]["name"], "arguments": calls[0]["arguments"]}}]},
               {"role": "tool", "tool_call_id": calls[0]["id"], "content": RESULT}]
    text, reasoning, calls, finish = chat_streamed(oai, history)
    assert (text, reasoning, calls, finish) == (tiny.ANSWER, tiny.THOUGHT_ANSWER, [], "stop")


# --- /v1/responses (Codex and other Responses-API clients) ---------------------------------------------

RESPONSES_TOOLS = [{"type": "function", "name": tiny.TOOL_NAME, "description": DESCRIPTION, "parameters": PARAMETERS}]


def assert_responses_call(response):
    kinds = [item.type for item in response.output]
    assert kinds == ["reasoning", "function_call"], kinds
    reasoning, call = response.output
    assert [c.text for c in reasoning.content] == [tiny.THOUGHT_CALL]
    assert (call.name, json.loads(call.arguments)) == (tiny.TOOL_NAME, {"city": "Paris"})
    assert call.call_id
    assert response.output_text == ""
    return call


def responses_turn(oai, response, call):
    """The output items replayed (reasoning included, as Codex does) with the function's output."""
    replayed = [item.model_dump(exclude_none=True) for item in response.output]
    return [{"role": "user", "content": QUESTION}] + replayed + [
        {"type": "function_call_output", "call_id": call.call_id, "output": RESULT}]


def assert_responses_answer(response):
    assert [item.type for item in response.output] == ["reasoning", "message"]
    assert [c.text for c in response.output[0].content] == [tiny.THOUGHT_ANSWER]
    assert response.output_text == tiny.ANSWER
    assert_clean(response.output_text)


def test_responses_function_call_reasoning_item_and_tool_result(oai):
    response = oai.responses.create(model=MODEL, input=QUESTION, tools=RESPONSES_TOOLS, temperature=0,
                                    max_output_tokens=512)
    assert response.status == "completed"
    call = assert_responses_call(response)
    answer = oai.responses.create(model=MODEL, input=responses_turn(oai, response, call), tools=RESPONSES_TOOLS,
                                  temperature=0, max_output_tokens=512)
    assert_responses_answer(answer)


def responses_streamed(oai, input_):
    """A streamed response read as Responses clients read it: the typed events, text and reasoning from their
    deltas, the items from ``response.output_item.done``, the final response from ``response.completed``.

    (The SDK's ``responses.stream()`` helper refuses this llama.cpp's events, which carry no ``output_index``:
    "Duplicate response output index None"; see the README's troubleshooting.)"""
    events = list(oai.responses.create(model=MODEL, input=input_, tools=RESPONSES_TOOLS, temperature=0,
                                       max_output_tokens=512, stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed", kinds
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [i.model_dump(exclude_none=True) for i in done] == [
        i.model_dump(exclude_none=True) for i in events[-1].response.output]
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    reasoning = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    arguments = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    return events[-1].response, text, reasoning, arguments


def test_responses_streamed(oai):
    response, text, reasoning, arguments = responses_streamed(oai, QUESTION)
    assert (text, reasoning, json.loads(arguments)) == ("", tiny.THOUGHT_CALL, {"city": "Paris"})
    call = assert_responses_call(response)
    answer, text, reasoning, arguments = responses_streamed(oai, responses_turn(oai, response, call))
    assert (text, reasoning, arguments) == (tiny.ANSWER, tiny.THOUGHT_ANSWER, "")
    assert_responses_answer(answer)


# --- /v1/messages (Claude Code and other Anthropic-API clients) -------------------------------------------

MESSAGES_TOOLS = [{"name": tiny.TOOL_NAME, "description": DESCRIPTION, "input_schema": PARAMETERS}]


def assert_tool_use(message):
    assert message.stop_reason == "tool_use"
    assert [block.type for block in message.content] == ["thinking", "tool_use"]
    thinking, tool_use = message.content
    assert thinking.thinking == tiny.THOUGHT_CALL
    assert (tool_use.name, tool_use.input) == (tiny.TOOL_NAME, {"city": "Paris"}) and tool_use.id
    return tool_use


def messages_turn(message, tool_use):
    """The assistant's blocks sent back as they came (thinking included, as Anthropic clients must) and the result."""
    return [{"role": "user", "content": QUESTION},
            {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in message.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use.id, "content": RESULT}]}]


def assert_messages_answer(message):
    assert message.stop_reason == "end_turn"
    assert [block.type for block in message.content] == ["thinking", "text"]
    assert message.content[0].thinking == tiny.THOUGHT_ANSWER
    assert message.content[1].text == tiny.ANSWER
    assert_clean(message.content[1].text)


def test_messages_tool_use_thinking_block_and_tool_result(claude):
    message = claude.messages.create(model=MODEL, max_tokens=512, tools=MESSAGES_TOOLS, extra_body=GREEDY,
                                     messages=[{"role": "user", "content": QUESTION}])
    tool_use = assert_tool_use(message)
    answer = claude.messages.create(model=MODEL, max_tokens=512, tools=MESSAGES_TOOLS, extra_body=GREEDY,
                                    messages=messages_turn(message, tool_use))
    assert_messages_answer(answer)


def test_messages_streamed(claude):
    with claude.messages.stream(model=MODEL, max_tokens=512, tools=MESSAGES_TOOLS, extra_body=GREEDY,
                                messages=[{"role": "user", "content": QUESTION}]) as stream:
        kinds = [e.type for e in stream]
        message = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop", kinds
    tool_use = assert_tool_use(message)
    with claude.messages.stream(model=MODEL, max_tokens=512, tools=MESSAGES_TOOLS, extra_body=GREEDY,
                                messages=messages_turn(message, tool_use)) as stream:
        text = "".join(stream.text_stream)
        answer = stream.get_final_message()
    assert text == tiny.ANSWER
    assert_messages_answer(answer)


# --- an agent's first request: tens of thousands of tokens on every API ------------------------------------

#: An agent's first request is its system prompt and tool definitions before the user's words: ~37,000 of the tiny
#: model's tokens for Claude Code, ~24,000 for Codex (docs/agents.md). The demo must take 40,000 on every API.
AGENT_TOKENS = 40_000
INDEX_LINE = "src/module_{0:05d}.py:{0}: def handler_{0:05d}(request): return respond(request, status=200)\n"


@pytest.fixture(scope="module")
def agent_sized_question(deployed):  # noqa: F811
    """The question after a project index of just over AGENT_TOKENS tokens (counted by llama-server's /tokenize):
    one user message, the same on every API, so that llama-server's prompt cache reuses the first API's prefill."""
    lines = 400
    while True:
        index = "".join(INDEX_LINE.format(i) for i in range(lines))
        tokens = len(requests.post(API + "/tokenize", json={"content": index}, timeout=60).json()["tokens"])
        if tokens >= AGENT_TOKENS:
            return "Here is the project's index:\n%s\n%s" % (index, QUESTION)
        lines += (AGENT_TOKENS - tokens) // 80 + 1


def test_an_agents_first_request_of_40k_tokens_is_answered_on_every_api(oai, claude, agent_sized_question):
    """Each API accepts a 40k-token request (no exceed_context_size_error) and answers it with the structured call
    and the reasoning in the API's own field; the reply is bounded by max_tokens (the scripted one is 11 tokens)."""
    started = time.time()
    chat = oai.with_options(timeout=900).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": agent_sized_question}], tools=CHAT_TOOLS, temperature=0,
        max_tokens=64)
    took = {"chat": time.time() - started}
    assert chat.usage.prompt_tokens > AGENT_TOKENS, chat.usage
    assert chat.choices[0].finish_reason == "tool_calls"
    assert chat.choices[0].message.reasoning_content == tiny.THOUGHT_CALL
    assert json.loads(chat.choices[0].message.tool_calls[0].function.arguments) == {"city": "Paris"}

    started = time.time()
    response = oai.with_options(timeout=900).responses.create(
        model=MODEL, input=[{"role": "user", "content": agent_sized_question}], tools=RESPONSES_TOOLS, temperature=0,
        max_output_tokens=64)
    took["responses"] = time.time() - started
    assert response.status == "completed" and response.usage.input_tokens > AGENT_TOKENS, response.usage
    assert_responses_call(response)

    started = time.time()
    message = claude.with_options(timeout=900).messages.create(
        model=MODEL, max_tokens=64, tools=MESSAGES_TOOLS, extra_body=GREEDY,
        messages=[{"role": "user", "content": agent_sized_question}])
    took["messages"] = time.time() - started
    usage = message.usage
    assert usage.input_tokens + (usage.cache_read_input_tokens or 0) > AGENT_TOKENS, usage
    assert_tool_use(message)
    print("40k-token request (%d tokens): %s" % (chat.usage.prompt_tokens,
                                                 ", ".join("%s %.1f s" % item for item in took.items())))


# --- reasoning where each API's clients read it, proven through site.yml -------------------------------------

def test_reasoning_in_the_text_fails_verify_naming_the_field_and_the_verified_head_serves_again(deployed):  # noqa: F811
    """llama-server's --reasoning-format none leaves M3's thought in the text: every API still returns the call, but
    no client finds the reasoning where it reads it (and sends it back). verify fails naming each API's field, and
    the verified deployment serves again."""
    runner = run_playbook("site.yml", tags=["head_server", "verify"],
                          extravars={"head_server_extra_args": ["--reasoning-format", "none"]})
    assert runner.status == "failed"
    msg = failed_tasks(runner)[-1][2]
    thought = "<mm:think>%s</mm:think>" % tiny.THOUGHT_CALL
    assert msg.startswith(
        "Tool-call canary failed on /v1/chat/completions: the reasoning is not in reasoning_content: thinking markup "
        "<mm:think>, </mm:think> in content (finish_reason=tool_calls, content=%r, tool_calls=1, first call "
        "get_weather({\"city\":\"Paris\"})). Also failed: /v1/chat/completions (streamed): the reasoning is not in "
        "reasoning_content" % thought), msg
    assert ("/v1/responses: the reasoning is not in a reasoning output item: thinking markup <mm:think>, </mm:think> "
            "in the text (") in msg
    assert "/v1/messages (streamed): the reasoning is not in a thinking block: thinking markup" in msg
    assert ("Fix: clients read M3's reasoning only from that field (chat: reasoning_content; Responses: the "
            "reasoning item; Messages: the thinking block)") in msg
    assert "Now serving: the last verified deployment again (template mode native" in msg
    # the verified deployment answers again, its reasoning where clients read it
    _, argv = serving_argv()
    assert "--reasoning-format" not in argv
    reply = openai.OpenAI(base_url=API + "/v1", api_key="no-key", max_retries=0, timeout=120).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": QUESTION}], tools=CHAT_TOOLS, temperature=0, max_tokens=64)
    assert reply.choices[0].message.reasoning_content == tiny.THOUGHT_CALL and not reply.choices[0].message.content
