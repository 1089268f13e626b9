"""Drives a running `moestream serve` with the official `openai` package.

Checks what an OpenAI client relies on: models.list, chat.completions.create
with and without stream (the streamed deltas join to the same text as the
whole answer at temperature 0, the final chunk carries usage), completions,
and that an unknown model raises NotFoundError. Exits 1 on the first failure.

    python3 -m venv /work/venv-tf && /work/venv-tf/bin/pip install openai
    target/debug/moestream serve --model tests/fixtures/qwen3_moe \
        --chat-template FILE --port 8080 &
    /work/venv-tf/bin/python scripts/openai_client_check.py http://127.0.0.1:8080/v1

tests/serve.rs runs it (ignored by default: it needs the package); see
`openai_python_client_drives_the_server` there.
"""

import sys

import openai

BASE = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8080/v1"
client = openai.OpenAI(base_url=BASE, api_key=sys.argv[2] if len(sys.argv) > 2 else "none")


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
print("all checks passed")
