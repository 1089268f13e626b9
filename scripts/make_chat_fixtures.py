"""Renders the expected outputs of tests/chat_template.rs with transformers itself.

For every template tests/fixtures/chat_templates/<name>.jinja (with its special
tokens in <name>.json beside it), every conversation in CONVERSATIONS, and
add_generation_prompt False and True, this renders the conversation the way
transformers does when a model's tokenizer applies its chat template:
`PreTrainedTokenizerFast.apply_chat_template(messages, tokenize=False,
add_generation_prompt=...)` on a tokenizer built around a fixture
tokenizer.json, with `chat_template`, `bos_token` and `eos_token` set from the
fixture (a null token is left unset, as a model without one has it). A
conversation the template refuses (raise_exception, or any other exception
while rendering) is recorded as an error with the exception's type and text.

No template here calls strftime_now, so no output depends on the date; the
script refuses a template that does, rather than record a date.

Output: tests/fixtures/chat_templates/expected.json, a list of
{template, messages, add_generation_prompt, expected} or
{template, messages, add_generation_prompt, error, error_type}; and
tools/expected.json for the tool-calling templates of tools/: the same
with `tools` and `chat_template_kwargs` passed to apply_chat_template.

Run from the repository root (no torch needed):

    python3 -m venv /work/venv-tf
    /work/venv-tf/bin/pip install transformers jinja2
    /work/venv-tf/bin/python scripts/make_chat_fixtures.py
    /work/venv-tf/bin/python scripts/make_chat_fixtures.py ../shared/chat_templates

The committed expected.json was made with transformers 5.24.0 and jinja2 3.1.6.
"""

import json
import pathlib

import jinja2
import transformers
from transformers import PreTrainedTokenizerFast

ROOT = pathlib.Path(__file__).resolve().parent.parent
import sys

# The folder of templates: the committed ones (written for these tests in
# the shape of each family's template), or another folder given as the
# argument (the models' real templates, kept outside the repository).
FIXTURES = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "tests" / "fixtures" / "chat_templates"
# Any tokenizer.json serves: rendering to text never tokenizes.
TOKENIZER_JSON = ROOT / "tests" / "fixtures" / "qwen3_moe" / "tokenizer.json"


def msg(role, content):
    return {"role": role, "content": content}


CONVERSATIONS = [
    # system + user
    [msg("system", "You are a helpful assistant."), msg("user", "Hello!")],
    # user only
    [msg("user", "What is 2+2?")],
    # multi-turn user / assistant / user
    [
        msg("user", "Hi."),
        msg("assistant", "Hello! How can I help?"),
        msg("user", "Tell me a joke."),
    ],
    # system + multi-turn, ending on the assistant (a training-style prompt)
    [
        msg("system", "Be brief."),
        msg("user", "Name a colour."),
        msg("assistant", "Blue."),
    ],
    # unicode, newlines, leading and trailing spaces
    [
        msg("system", "  Réponds en français.\n"),
        msg("user", "  Grüße, 世界 🌍\nline two\n\n  "),
        msg("assistant", "\n  Bonjour — ça va ?  \n"),
        msg("user", "日本語で\tタブ\r\nと改行"),
    ],
    # an assistant turn carrying its reasoning inline
    [
        msg("user", "Is 7 prime?"),
        msg("assistant", "<think>\nDivisors of 7: 1 and 7.\n</think>\n\nYes, 7 is prime."),
        msg("user", "And 9?"),
    ],
    # reasoning in the last assistant turn, after the last user turn
    [
        msg("user", "Think first."),
        msg("assistant", "<think>ok</think>Done."),
    ],
    # whitespace Python strips but Rust's trim does not (U+001C..U+001F), and
    # U+3000 which both strip
    [
        msg("user", "\x1cstrip me\x1f"),
        msg("assistant", "\x1f\u3000 answer \u3000\x1e"),
        msg("user", "again"),
    ],
    # empty contents
    [msg("user", ""), msg("assistant", ""), msg("user", "")],
    # two system messages
    [msg("system", "First rule."), msg("system", "Second rule."), msg("user", "Go.")],
    # a tool result turn (role tool with a string content)
    [
        msg("user", "What's the weather?"),
        msg("assistant", "Let me check."),
        msg("tool", '{"temperature": 21}'),
    ],
    # roles that do not alternate (Mixtral refuses)
    [msg("user", "One."), msg("user", "Two.")],
    # the assistant speaks first (Mixtral refuses)
    [msg("assistant", "I start."), msg("user", "Fine.")],
    # an empty conversation
    [],
]


def load_template(name):
    text = (FIXTURES / f"{name}.jinja").read_text(encoding="utf-8")
    if "strftime_now" in text:
        raise SystemExit(f"{name}.jinja calls strftime_now: its output depends on the date")
    tokens = json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))
    return text, tokens


def make_tokenizer(text, tokens):
    special = {k: v for k, v in tokens.items() if v is not None}
    tok = PreTrainedTokenizerFast(tokenizer_file=str(TOKENIZER_JSON), **special)
    tok.chat_template = text
    return tok


def render_case(tok, name, messages, add_generation_prompt):
    case = {
        "template": name,
        "messages": messages,
        "add_generation_prompt": add_generation_prompt,
    }
    try:
        case["expected"] = tok.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )
    except Exception as e:  # the template's refusal is the expected outcome
        case["error"] = str(e)
        case["error_type"] = type(e).__name__
    return case


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {"name": "get_time", "description": "Ésta hora.", "parameters": {"type": "object", "properties": {}}},
}


def call(i, name, arguments):
    # Arguments as an object: the server parses OpenAI's JSON string into
    # one before rendering (as vLLM does), so GLM's `.items()` works.
    return {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": arguments}}


# (messages, tools, chat_template_kwargs): tools offered, a call made, its
# result, two calls at once, a call with text before it, the thinking
# switches. Rendered into tools/expected.json.
TOOL_CONVERSATIONS = [
    ([msg("user", "Weather in Paris?")], [WEATHER], {}),
    ([msg("system", "Be brief."), msg("user", "Weather and time?")], [WEATHER, TIME], {}),
    (
        [
            msg("user", "Weather in Paris?"),
            {"role": "assistant", "content": None, "tool_calls": [call(0, "get_weather", {"city": "Paris", "days": 2})]},
            {"role": "tool", "tool_call_id": "call_0", "content": '{"temp": 21}'},
        ],
        [WEATHER],
        {},
    ),
    (
        [
            msg("user", "Paris and Oslo, and the time?"),
            {
                "role": "assistant",
                "content": "Checking.",
                "tool_calls": [call(0, "get_weather", {"city": "Paris"}), call(1, "get_weather", {"city": "Oslo"})],
            },
            {"role": "tool", "tool_call_id": "call_0", "content": "sunny"},
            {"role": "tool", "tool_call_id": "call_1", "content": "rain"},
            msg("assistant", "Paris is sunny, Oslo rainy."),
            msg("user", "Thanks."),
        ],
        [WEATHER, TIME],
        {},
    ),
    ([msg("user", "Hi.")], None, {"enable_thinking": False}),
    ([msg("user", "Hi.")], None, {"enable_thinking": True}),
    ([msg("user", "Hi.")], [WEATHER], {"thinking": True}),
]


def tool_cases():
    folder = FIXTURES / "tools"
    cases = []
    for name in sorted(p.stem for p in folder.glob("*.jinja")):
        text = (folder / f"{name}.jinja").read_text(encoding="utf-8")
        tokens = json.loads((folder / f"{name}.json").read_text(encoding="utf-8"))
        tok = make_tokenizer(text, tokens)
        for messages, tools, kwargs in TOOL_CONVERSATIONS:
            for agp in (False, True):
                case = {"template": name, "messages": messages, "tools": tools,
                        "chat_template_kwargs": kwargs, "add_generation_prompt": agp}
                try:
                    case["expected"] = tok.apply_chat_template(
                        messages, tools=tools, tokenize=False, add_generation_prompt=agp, **kwargs
                    )
                except Exception as e:
                    case["error"] = str(e)
                    case["error_type"] = type(e).__name__
                cases.append(case)
    out = folder / "expected.json"
    out.write_text(json.dumps(cases, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"{len(cases)} tool cases ({sum('error' in c for c in cases)} errors) -> {out}")


def main():
    if (FIXTURES / "tools").is_dir():
        tool_cases()
    names = sorted(p.stem for p in FIXTURES.glob("*.jinja"))
    cases = []
    for name in names:
        tok = make_tokenizer(*load_template(name))
        for messages in CONVERSATIONS:
            for agp in (False, True):
                cases.append(render_case(tok, name, messages, agp))
    out = FIXTURES / "expected.json"
    out.write_text(json.dumps(cases, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    errors = sum("error" in c for c in cases)
    print(
        f"{len(cases)} cases ({errors} errors) from {len(names)} templates -> {out}"
        f" (transformers {transformers.__version__}, jinja2 {jinja2.__version__})"
    )


if __name__ == "__main__":
    main()
