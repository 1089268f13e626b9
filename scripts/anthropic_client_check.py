"""Drives a running `moestream serve` with the official `anthropic` package,
as Claude Code and other Messages API clients do (ANTHROPIC_BASE_URL).

Checks: messages.create whole and streamed (the text deltas join to the
same text at temperature 0; the stream's events come in Anthropic's
order), count_tokens agreeing with usage, a two-step tool loop (a tool_use
forced by tool_choice any, its tool_result sent back), and an error in
Anthropic's shape for a missing max_tokens. Exits 1 on the first failure.

    python3 -m venv /work/venv-clients && /work/venv-clients/bin/pip install anthropic
    target/debug/moestream serve --model tests/fixtures/qwen3_moe \
        --chat-template FILE_WITH_TOOL_CALLS --api-key k --port 8080 &
    /work/venv-clients/bin/python scripts/anthropic_client_check.py http://127.0.0.1:8080 k

tests/agents.rs runs it (ignored by default: it needs the package); see
`anthropic_python_client_runs_a_tool_loop` there.
"""

import sys

import anthropic

BASE = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8080"
client = anthropic.Anthropic(base_url=BASE, api_key=sys.argv[2] if len(sys.argv) > 2 else "none")
MODEL = "moestream"  # the server answers 404 for a model it does not serve: ask /v1/models


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}")
        sys.exit(1)
    print(f"ok: {what}")


import urllib.request, json  # noqa: E402

req = urllib.request.Request(f"{BASE}/v1/models", headers={"x-api-key": client.api_key})
MODEL = json.load(urllib.request.urlopen(req))["data"][0]["id"]

messages = [{"role": "user", "content": "What does the expert cache hold?"}]
whole = client.messages.create(model=MODEL, max_tokens=12, temperature=0, system="Be brief.", messages=messages)
text = "".join(b.text for b in whole.content if b.type == "text")
check(whole.role == "assistant" and whole.stop_reason in ("end_turn", "max_tokens"), "messages: an answer")
counted = client.messages.count_tokens(model=MODEL, system="Be brief.", messages=messages)
check(counted.input_tokens == whole.usage.input_tokens, "count_tokens agrees with usage")

events, deltas = [], []
with client.messages.stream(model=MODEL, max_tokens=12, temperature=0, system="Be brief.", messages=messages) as s:
    for ev in s:
        events.append(ev.type)
        if ev.type == "content_block_delta" and ev.delta.type == "text_delta":
            deltas.append(ev.delta.text)
    final = s.get_final_message()
check(events[0] == "message_start" and events[-1] == "message_stop", "stream: Anthropic's event order")
check("".join(deltas) == text, "stream: the deltas join to the whole answer")
check(final.usage.output_tokens == whole.usage.output_tokens, "stream: usage in message_delta")

weather = {"name": "get_weather", "description": "The weather.", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
    "required": ["city"], "additionalProperties": False}}
ask = [{"role": "user", "content": "Weather in Paris?"}]
first = client.messages.create(model=MODEL, max_tokens=60, tools=[weather], tool_choice={"type": "any"}, messages=ask)
use = next(b for b in first.content if b.type == "tool_use")
check(first.stop_reason == "tool_use" and use.name == "get_weather" and isinstance(use.input["city"], str),
      "tools: a tool_use block matching the schema")
ask += [{"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}]}]
after = client.messages.create(model=MODEL, max_tokens=8, temperature=0, tools=[weather], messages=ask)
check(after.usage.input_tokens > first.usage.input_tokens, "tools: the result continues the conversation")

try:
    client.messages.create(model=MODEL, max_tokens=0, messages=messages)
    check(False, "max_tokens 0 is refused")
except anthropic.BadRequestError as e:
    check(e.body["type"] == "error" and e.body["error"]["type"] == "invalid_request_error",
          "errors come in Anthropic's shape")
print("all checks passed")
