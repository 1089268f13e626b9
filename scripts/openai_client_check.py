"""Drives a running `moestream serve` with the official `openai` package.

Checks what an OpenAI client relies on: models.list, chat.completions.create
with and without stream (the streamed deltas join to the same text as the
whole answer at temperature 0, the final chunk carries usage), completions,
and that an unknown model raises NotFoundError. Exits 1 on the first failure.

    python3 -m venv /work/venv-tf && /work/venv-tf/bin/pip install openai
    target/debug/moestream serve --model tests/fixtures/qwen3_moe \
        --chat-template FILE --port 8080 &
    /work/venv-tf/bin/python scripts/openai_client_check.py http://127.0.0.1:8080/v1

With `--tools` (a server whose chat template writes tool calls) it also
runs a two-step tool loop: a call forced by tool_choice="required", whole
and streamed (the streamed pieces gather into the same call), then the
tool's result sent back, answered in text.

tests/serve.rs runs it (ignored by default: it needs the package); see
`openai_python_client_drives_the_server` there, and tests/agents.rs
`openai_python_client_runs_a_tool_loop` for `--tools`.
"""

import sys

import openai

TOOLS = "--tools" in sys.argv
ARGS = [a for a in sys.argv[1:] if a != "--tools"]
BASE = ARGS[0] if ARGS else "http://127.0.0.1:8080/v1"
client = openai.OpenAI(base_url=BASE, api_key=ARGS[1] if len(ARGS) > 1 else "none")


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}")
        sys.exit(1)
    print(f"ok: {what}")


models = client.models.list()
name = models.data[0].id
check(len(models.data) == 1 and name, f"models.list serves {name!r}")

messages = [{"role": "user", "content": "What does the expert cache hold?"}]
whole = client.chat.completions.create(model=name, messages=messages, max_tokens=12, temperature=0)
text = whole.choices[0].message.content
check(whole.choices[0].message.role == "assistant", "chat: the assistant answers")
check(whole.usage.completion_tokens == 12, "chat: usage counts 12 tokens")

stream = client.chat.completions.create(
    model=name, messages=messages, max_tokens=12, temperature=0, stream=True,
    stream_options={"include_usage": True},
)
deltas, usage, reasons = [], None, []
for chunk in stream:
    if chunk.usage is not None:
        usage = chunk.usage
    for c in chunk.choices:
        if c.delta.content:
            deltas.append(c.delta.content)
        if c.finish_reason:
            reasons.append(c.finish_reason)
check("".join(deltas) == text, "chat stream: the deltas join to the whole answer")
check(usage is not None and usage.completion_tokens == 12, "chat stream: the last chunk carries usage")
check(reasons == ["length"], "chat stream: one finish reason, length")

done = client.completions.create(model=name, prompt="The router picks", max_tokens=5, temperature=0)
check(done.choices[0].finish_reason == "length" and done.usage.completion_tokens == 5, "completions")

try:
    client.chat.completions.create(model="no-such-model", messages=messages, max_tokens=2)
    check(False, "an unknown model is refused")
except openai.NotFoundError:
    check(True, "an unknown model raises NotFoundError (404)")

if TOOLS:
    import json

    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
        "required": ["city"], "additionalProperties": False}}}
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    first = client.chat.completions.create(
        model=name, messages=ask, tools=[weather], tool_choice="required", max_tokens=60, seed=1,
        temperature=1,
    )
    call = first.choices[0].message.tool_calls[0]
    args = json.loads(call.function.arguments)
    check(first.choices[0].finish_reason == "tool_calls", "tools: finish_reason tool_calls")
    check(call.function.name == "get_weather" and isinstance(args["city"], str), "tools: the call parses")
    stream = client.chat.completions.create(
        model=name, messages=ask, tools=[weather], tool_choice="required", max_tokens=60, seed=1,
        temperature=1, stream=True,
    )
    name_parts, arg_parts = [], []
    for chunk in stream:
        for c in chunk.choices:
            for t in c.delta.tool_calls or []:
                name_parts.append(t.function.name or "")
                arg_parts.append(t.function.arguments or "")
    check("".join(name_parts) == "get_weather" and json.loads("".join(arg_parts)) == args,
          "tools: the streamed call gathers to the whole one")
    ask += [first.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    after = client.chat.completions.create(model=name, messages=ask, tools=[weather], max_tokens=8, temperature=0)
    check(after.choices[0].message.role == "assistant" and after.usage.prompt_tokens > first.usage.prompt_tokens,
          "tools: the result continues the conversation")
print("all checks passed")
