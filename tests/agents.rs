//! What agents and chat clients need from `/v1/chat/completions`, driven
//! over HTTP on the fixture models: tool calls forced by `tool_choice`
//! parse and match their schema in every family's format, whole and
//! streamed; tool results continue the conversation; `tool_choice: none`
//! hides the tools; constrained JSON is compact and ends with `stop`.
//! The tool templates are tests/fixtures/chat_templates/tools (checked
//! against transformers in tests/chat_template.rs).

mod common;

use common::fixture;
use common::server::{chat, run_client_script, text_of, Server, CHATML};
use serde_json::{json, Value};

fn template(name: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/chat_templates/tools")
        .join(format!("{name}.jinja"));
    std::fs::read_to_string(path).unwrap()
}

/// A ChatML template listing the tools by name, each family's call format
/// (`calls`, a Jinja block over `m.tool_calls` as `tc`), and tool results:
/// the fixture models hold 256 positions, too few for the families' real
/// tool prompts (those render as transformers does in tests/chat_template.rs).
fn compact(calls: &str) -> String {
    format!(
        "{{%- if tools %}}<|im_start|>system\n{{% for t in tools %}}{{{{ t.function.name }}}} {{% endfor %}}<|im_end|>\n{{% endif %}}\
{{%- for m in messages %}}\
{{%- if m.role == 'tool' %}}<|im_start|>user\n<tool_response>{{{{ m.content }}}}</tool_response><|im_end|>\n\
{{%- else %}}<|im_start|>{{{{ m.role }}}}\n{{{{ m.content or '' }}}}{{% for tc in m.tool_calls or [] %}}{calls}{{% endfor %}}<|im_end|>\n{{% endif %}}\
{{%- endfor %}}{{%- if add_generation_prompt %}}<|im_start|>assistant\n{{% endif %}}"
    )
}

/// The compact templates of the four tool-call formats.
fn compact_templates() -> [(&'static str, String); 4] {
    [
        ("hermes", compact("<tool_call>\n{{ {'name': tc.function.name, 'arguments': tc.function.arguments} | tojson }}\n</tool_call>")),
        ("deepseek", compact("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>{{ tc.function.name }}<｜tool▁sep｜>{{ tc.function.arguments | tojson }}<｜tool▁call▁end｜><｜tool▁calls▁end｜>")),
        ("glm", compact("<tool_call>{{ tc.function.name }}\n{% for k, v in tc.function.arguments.items() %}<arg_key>{{ k }}</arg_key>\n<arg_value>{{ v }}</arg_value>\n{% endfor %}</tool_call>")),
        ("mistral", compact("[TOOL_CALLS] [{{ {'name': tc.function.name, 'arguments': tc.function.arguments} | tojson }}]")),
    ]
}

fn hermes() -> String {
    compact_templates()[0].1.clone()
}

fn weather() -> Value {
    json!({"type": "function", "function": {"name": "get_weather", "description": "The weather.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "minLength": 1, "maxLength": 8},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
            "unit": {"type": "string", "enum": ["c", "f"]}},
        "required": ["city", "unit"], "additionalProperties": false}}})
}

fn time() -> Value {
    json!({"type": "function", "function": {"name": "get_time",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 6}},
                       "required": ["zone"], "additionalProperties": false}}})
}

/// A sampled request offering both tools with `choice`.
fn tool_request(choice: Value, seed: u64) -> Value {
    let mut body = chat("What is the weather in Paris?", 120);
    body["temperature"] = json!(1);
    body["seed"] = json!(seed);
    body["tools"] = json!([weather(), time()]);
    body["tool_choice"] = choice;
    // One call, so the grammar ends the answer: with parallel calls on, a
    // model that never learned tools (the trained fixture read Python's
    // documentation) goes on calling until the budget runs out.
    body["parallel_tool_calls"] = json!(false);
    body
}

/// Panics unless `call` is an OpenAI tool call whose arguments match
/// its tool's schema; returns (name, arguments).
fn check_call(call: &Value) -> (String, Value) {
    assert_eq!(call["type"], "function", "{call}");
    assert!(
        call["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("call_")),
        "{call}"
    );
    let name = call["function"]["name"].as_str().unwrap().to_string();
    let text = call["function"]["arguments"].as_str().unwrap();
    let args: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    let obj = args.as_object().unwrap();
    match name.as_str() {
        "get_weather" => {
            assert!(obj["city"].is_string(), "{args}");
            assert!(obj["unit"] == "c" || obj["unit"] == "f", "{args}");
            if let Some(d) = obj.get("days") {
                assert!(d.as_u64().is_some_and(|d| (1..=7).contains(&d)), "{args}");
            }
            assert!(
                obj.keys()
                    .all(|k| ["city", "days", "unit"].contains(&k.as_str())),
                "{args}"
            );
        }
        "get_time" => {
            assert!(obj["zone"].is_string() && obj.len() == 1, "{args}");
        }
        other => panic!("a call to {other}"),
    }
    (name, args)
}

/// Calls of a whole answer, checked; the finish reason must say so.
fn calls_of(reply: &Value) -> Vec<(String, Value)> {
    let choice = &reply["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{reply}");
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert!(!calls.is_empty(), "{reply}");
    calls.iter().map(check_call).collect()
}

#[test]
fn required_tool_calls_parse_and_match_their_schema_in_every_format() {
    let model = fixture("trained/qwen3_moe");
    for (name, template) in compact_templates() {
        let seeds = if name == "hermes" { 20 } else { 6 };
        let s = Server::start_with_template(&model, &template, &[]);
        for seed in 0..seeds {
            let r = s.post(
                "/v1/chat/completions",
                &tool_request(json!("required"), seed),
            );
            assert_eq!(r.status, 200, "{name} seed {seed}: {}", r.json);
            calls_of(&r.json);
        }
        // A named function: exactly that one, even with parallel calls off.
        let named = json!({"type": "function", "function": {"name": "get_time"}});
        let mut body = tool_request(named, 1);
        body["parallel_tool_calls"] = json!(false);
        let r = s.post("/v1/chat/completions", &body);
        let calls = calls_of(&r.json);
        assert_eq!(calls.len(), 1, "{name}: {}", r.json);
        assert_eq!(calls[0].0, "get_time", "{name}");
    }
}

/// A streamed answer's calls as OpenAI's clients gather them (each call's
/// pieces by index), checked; its content; its last chunk.
fn streamed_calls(s: &Server, body: &Value) -> (Vec<(String, Value)>, String, Value) {
    let mut stream_body = body.clone();
    stream_body["stream"] = json!(true);
    let chunks = s.stream("/v1/chat/completions", &stream_body);
    let mut calls: Vec<Value> = Vec::new();
    let mut content = String::new();
    for c in &chunks {
        let delta = &c["choices"][0]["delta"];
        content.push_str(delta["content"].as_str().unwrap_or(""));
        for d in delta["tool_calls"].as_array().into_iter().flatten() {
            let i = d["index"].as_u64().unwrap() as usize;
            if calls.len() <= i {
                calls.push(json!({"id": "", "type": "function", "function": {"name": "", "arguments": ""}}));
            }
            let call = &mut calls[i];
            for (field, at) in [
                ("id", "/id"),
                ("name", "/function/name"),
                ("arguments", "/function/arguments"),
            ] {
                let piece = match field {
                    "id" => d["id"].as_str(),
                    _ => d["function"][field].as_str(),
                };
                let slot = call.pointer_mut(at).unwrap();
                *slot = json!(format!("{}{}", slot.as_str().unwrap(), piece.unwrap_or("")));
            }
        }
    }
    let got = calls.iter().map(check_call).collect();
    (got, content, chunks.last().unwrap().clone())
}

#[test]
fn streamed_tool_calls_concatenate_to_the_whole_answer() {
    let s = Server::start_with_template(&fixture("trained/qwen3_moe"), &hermes(), &[]);
    for seed in [3, 4] {
        let body = tool_request(json!("required"), seed);
        let whole = s.post("/v1/chat/completions", &body);
        let want = calls_of(&whole.json);
        let (got, content, last) = streamed_calls(&s, &body);
        assert_eq!(last["choices"][0]["finish_reason"], "tool_calls", "{last}");
        assert_eq!(got, want, "seed {seed}");
        let whole_content = whole.json["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or("");
        assert_eq!(content, whole_content, "seed {seed}");
    }
}

/// DeepSeek's tool-call tokens, as its tokenizer has them.
const DEEPSEEK_MARKERS: [&str; 5] = [
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
];

/// A copy of the trained Qwen3 fixture whose tokenizer has `markers` as
/// added tokens (`special` or not), as a model's tool tokens are: each
/// takes the id of the token of one of the last merges (which no other
/// merge uses), so the model's logits cover it. Their ids, in order.
fn with_marker_tokens(markers: &[&str], special: bool) -> (tempfile::TempDir, Vec<u32>) {
    let dir = common::copy_fixture("trained/qwen3_moe");
    let path = dir.path().join("tokenizer.json");
    let mut t: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let mut ids = Vec::new();
    for m in markers {
        let merge = t["model"]["merges"].as_array_mut().unwrap().pop().unwrap();
        let piece = format!(
            "{}{}",
            merge[0].as_str().unwrap(),
            merge[1].as_str().unwrap()
        );
        let vocab = t["model"]["vocab"].as_object_mut().unwrap();
        let id = vocab.remove(&piece).unwrap();
        vocab.insert(m.to_string(), id.clone());
        let added = json!({"id": id, "content": m, "single_word": false, "lstrip": false,
                           "rstrip": false, "normalized": false, "special": special});
        t["added_tokens"].as_array_mut().unwrap().push(added);
        ids.push(id.as_u64().unwrap() as u32);
    }
    std::fs::write(&path, t.to_string()).unwrap();
    (dir, ids)
}

#[test]
fn special_tool_tokens_are_written_out_for_the_parser_and_nothing_else_is() {
    use moestream::formats::chat::tool_calls::ToolFormat;
    use moestream::formats::tokenizer::{TextStream, Tokenizer};
    let (dir, ids) = with_marker_tokens(&DEEPSEEK_MARKERS, true);
    let tok = Tokenizer::load(dir.path()).unwrap();
    let kept = tok.special_ids_of(ToolFormat::DeepSeek.marker_texts());
    let mut sorted = ids.clone();
    sorted.sort_unstable();
    assert_eq!(kept, sorted, "every marker is a special token of its own");
    let text = format!(
        "{}get_weather{}{{}}<|endoftext|>",
        DEEPSEEK_MARKERS[2], DEEPSEEK_MARKERS[4]
    );
    let encoded = tok.encode_raw(&text).unwrap();
    assert_eq!(encoded[0], ids[2]);
    assert_eq!(
        tok.decode(&encoded).unwrap(),
        "get_weather{}",
        "skipped, as before"
    );
    let want = text.strip_suffix("<|endoftext|>").unwrap();
    assert_eq!(
        tok.decode_keeping(&encoded, &kept).unwrap(),
        want,
        "EOS still skipped"
    );
    let mut stream = TextStream::keeping(&tok, kept);
    let streamed: String = encoded.iter().map(|&t| stream.push(t).unwrap()).collect();
    assert_eq!(streamed, want);
}

#[test]
fn an_auto_call_the_model_opens_is_held_to_the_schema_through_special_tokens() {
    // The marker made likely (logit_bias), the model opens a call with
    // the marker's own token; the rest of it is held to the schemas, and
    // the parser sees the markers, whole and streamed: DeepSeek's special
    // tokens, and Qwen3's `<tool_call>` (an added token, not special).
    let cases = [
        (
            &DEEPSEEK_MARKERS[..],
            true,
            compact_templates()[1].1.clone(),
        ),
        (&["<tool_call>", "</tool_call>"][..], false, hermes()),
    ];
    for (markers, special, template) in cases {
        let (model, ids) = with_marker_tokens(markers, special);
        let s = Server::start_with_template(model.path(), &template, &[]);
        for seed in 0..6 {
            let mut body = tool_request(json!("auto"), seed);
            body["logit_bias"] = json!({ids[0].to_string(): 100});
            let whole = s.post("/v1/chat/completions", &body);
            assert_eq!(
                whole.status, 200,
                "{} seed {seed}: {}",
                markers[0], whole.json
            );
            let want = calls_of(&whole.json);
            let (got, _, last) = streamed_calls(&s, &body);
            assert_eq!(last["choices"][0]["finish_reason"], "tool_calls", "{last}");
            assert_eq!(got, want, "{} seed {seed}", markers[0]);
        }
    }
}

#[test]
fn a_tool_result_continues_the_conversation_and_none_hides_the_tools() {
    let s = Server::start_with_template(&fixture("trained/qwen3_moe"), &hermes(), &[]);
    let first = s.post("/v1/chat/completions", &tool_request(json!("required"), 7));
    let call = first.json["choices"][0]["message"]["tool_calls"][0].clone();
    let mut messages = vec![
        json!({"role": "user", "content": "What is the weather in Paris?"}),
        first.json["choices"][0]["message"].clone(),
    ];
    let ask = |messages: &[Value]| {
        let mut body = tool_request(json!("auto"), 7);
        body["messages"] = json!(messages);
        body["temperature"] = json!(0);
        s.post("/v1/chat/completions", &body)
    };
    let before = ask(&messages);
    assert_eq!(before.status, 200, "{}", before.json);
    messages.push(json!({"role": "tool", "tool_call_id": call["id"], "content": "{\"temp\": 21}"}));
    let after = ask(&messages);
    assert_eq!(after.status, 200, "{}", after.json);
    let tokens = |r: &common::server::Reply| r.json["usage"]["prompt_tokens"].as_u64().unwrap();
    // The result is rendered: `<|im_start|>user\n<tool_response>{"temp": 21}</tool_response><|im_end|>\n`.
    let result_bytes =
        "<|im_start|>user\n<tool_response>{\"temp\": 21}</tool_response><|im_end|>\n".len();
    assert!(
        tokens(&after) > tokens(&before) + 8,
        "{} then {}",
        tokens(&before),
        tokens(&after)
    );
    assert!(tokens(&after) <= tokens(&before) + result_bytes as u64);

    // `none`: the template is shown no tools (the same prompt as without
    // them) and nothing is parsed.
    let plain = s.post(
        "/v1/chat/completions",
        &chat("What is the weather in Paris?", 8),
    );
    let none = s.post("/v1/chat/completions", &{
        let mut b = tool_request(json!("none"), 1);
        b["max_tokens"] = json!(8);
        b
    });
    assert_eq!(none.status, 200, "{}", none.json);
    assert_eq!(tokens(&none), tokens(&plain));
    assert!(none.json["choices"][0]["message"]
        .get("tool_calls")
        .is_none());
    let auto = s.post("/v1/chat/completions", &tool_request(json!("auto"), 1));
    assert!(
        tokens(&auto) > tokens(&plain) + 5,
        "the tools are in the prompt"
    );
}

#[test]
fn tool_fields_that_cannot_work_are_refused_by_name() {
    let s = Server::start_with_template(&fixture("trained/qwen3_moe"), CHATML, &[]);
    let cases = [
        (tool_request(json!("auto"), 0), "tools"), // ChatML writes no tool calls
        (
            {
                let mut b = chat("x", 4);
                b["tool_choice"] = json!("required");
                b
            },
            "tool_choice",
        ),
        (
            {
                let mut b = chat("x", 4);
                b["functions"] = json!([]);
                b
            },
            "functions",
        ),
    ];
    for (body, param) in cases {
        let r = s.post("/v1/chat/completions", &body);
        assert_eq!(r.status, 400, "{body}: {}", r.json);
        assert_eq!(r.json["error"]["param"], param, "{}", r.json);
    }
    let s = Server::start_with_template(&fixture("trained/qwen3_moe"), &hermes(), &[]);
    let unknown = json!({"type": "function", "function": {"name": "nope"}});
    let mut with_format = tool_request(json!("required"), 0);
    with_format["response_format"] = json!({"type": "json_object"});
    let mut bad_args = chat("x", 4);
    bad_args["messages"] = json!([{"role": "assistant", "content": null,
        "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{"}}]}]);
    for (body, param) in [
        (tool_request(unknown, 0), "tool_choice"),
        (tool_request(json!("maybe"), 0), "tool_choice"),
        (with_format, "tool_choice"),
        (bad_args, "messages"),
    ] {
        let r = s.post("/v1/chat/completions", &body);
        assert_eq!(r.status, 400, "{body}: {}", r.json);
        assert_eq!(r.json["error"]["param"], param, "{}", r.json);
    }
}

#[test]
fn constrained_json_is_compact_and_a_completed_grammar_finishes_with_stop() {
    let s = Server::start(&fixture("trained/qwen3_moe"), &[]);
    let schema = json!({"type": "object", "properties": {"ok": {"type": "boolean"},
        "n": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["ok", "n"], "additionalProperties": false});
    for seed in 0..8 {
        let mut body = chat("answer in JSON", 100);
        body["temperature"] = json!(1);
        body["seed"] = json!(seed);
        body["response_format"] =
            json!({"type": "json_schema", "json_schema": {"name": "t", "schema": schema}});
        let r = s.post("/v1/chat/completions", &body);
        let text = text_of(&r);
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        // One space after `,` and `:`, none elsewhere: the whole object
        // is what serde_json writes with those separators.
        let compact = v.to_string().replace(",\"", ", \"").replace("\":", "\": ");
        assert_eq!(text, compact, "seed {seed}");
        assert_eq!(r.json["choices"][0]["finish_reason"], "stop", "{}", r.json);
        assert!(r.json["usage"]["completion_tokens"].as_u64().unwrap() < 100);
    }
    // Out of budget inside the object: length.
    let mut body = chat("answer in JSON", 1);
    body["response_format"] = json!({"type": "json_object"});
    let r = s.post("/v1/chat/completions", &body);
    assert_eq!(
        r.json["choices"][0]["finish_reason"], "length",
        "{}",
        r.json
    );
}

/// A chat server on the DeepSeek-shaped tool template (its generation
/// prompt opens `<think>` under `thinking`), with `extra` flags.
fn thinking_server(extra: &[&str]) -> Server {
    Server::start_with_template(
        &fixture("trained/qwen3_moe"),
        &template("deepseek_tools"),
        extra,
    )
}

fn thinking_request(max_tokens: usize) -> Value {
    let mut body = chat("Is 7 prime?", max_tokens);
    body["chat_template_kwargs"] = json!({"thinking": true});
    body
}

#[test]
fn reasoning_is_split_whole_and_streamed_unless_the_format_is_none() {
    let s = thinking_server(&[]);
    let r = s.post("/v1/chat/completions", &thinking_request(12));
    assert_eq!(r.status, 200, "{}", r.json);
    let m = &r.json["choices"][0]["message"];
    // The prompt opened the reasoning and the model never closed it: all
    // of the answer is reasoning.
    let reasoning = m["reasoning_content"].as_str().unwrap().to_string();
    assert!(!reasoning.is_empty(), "{m}");
    assert_eq!(m["content"], "", "{m}");
    let mut body = thinking_request(12);
    body["stream"] = json!(true);
    let chunks = s.stream("/v1/chat/completions", &body);
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["reasoning_content"].as_str())
        .collect();
    assert_eq!(streamed, reasoning);
    let plain = thinking_server(&["--reasoning-format", "none"]);
    let r = plain.post("/v1/chat/completions", &thinking_request(12));
    let m = &r.json["choices"][0]["message"];
    assert_eq!(m["content"].as_str().unwrap(), reasoning);
    assert!(m.get("reasoning_content").is_none(), "{m}");
}

#[test]
fn template_kwargs_and_reasoning_effort_reach_the_template() {
    let s =
        Server::start_with_template(&fixture("trained/qwen3_moe"), &template("qwen3_tools"), &[]);
    let tokens = |body: &Value| {
        let r = s.post("/v1/chat/completions", body);
        assert_eq!(r.status, 200, "{body}: {}", r.json);
        r.json["usage"]["prompt_tokens"].as_u64().unwrap()
    };
    let plain = tokens(&chat("Hi.", 1));
    let mut off = chat("Hi.", 1);
    off["chat_template_kwargs"] = json!({"enable_thinking": false});
    // `<think>\n\n</think>\n\n` closes the reasoning in the prompt.
    let closed = tokens(&off);
    assert!(closed > plain, "{plain} then {closed}");
    let mut effort = chat("Hi.", 1);
    effort["reasoning_effort"] = json!("none");
    assert_eq!(tokens(&effort), closed);
    effort["reasoning_effort"] = json!("high");
    assert_eq!(tokens(&effort), plain);
    for (field, value) in [
        ("reasoning_effort", json!("extreme")),
        ("chat_template_kwargs", json!({"messages": []})),
    ] {
        let mut body = chat("Hi.", 1);
        body[field] = value;
        let r = s.post("/v1/chat/completions", &body);
        assert_eq!(
            (r.status, r.json["error"]["param"].clone()),
            (400, json!(field)),
            "{}",
            r.json
        );
    }
    let chatml = Server::start(&fixture("trained/qwen3_moe"), &[]);
    let mut body = chat("Hi.", 1);
    body["reasoning_effort"] = json!("low");
    let r = chatml.post("/v1/chat/completions", &body);
    assert_eq!(r.json["error"]["param"], "reasoning_effort", "{}", r.json);
}

#[test]
fn unseeded_requests_differ_report_their_seed_and_replay_with_it() {
    let s = Server::start(&fixture("trained/qwen3_moe"), &[]);
    let sampled = |seed: Option<u64>| {
        let mut body = chat("Tell me a story.", 24);
        body["temperature"] = json!(1);
        if let Some(seed) = seed {
            body["seed"] = json!(seed);
        }
        let r = s.post("/v1/chat/completions", &body);
        let fp = r.json["system_fingerprint"].as_str().unwrap().to_string();
        (text_of(&r), fp, r.json["id"].as_str().unwrap().to_string())
    };
    let (a, fa, ida) = sampled(None);
    let (b, fb, idb) = sampled(None);
    assert_ne!(fa, fb);
    assert_ne!(a, b, "two unseeded sampled answers were the same");
    assert_ne!(ida, idb);
    let seed: u64 = fa.trim_start_matches("moestream-seed-").parse().unwrap();
    assert_eq!(
        sampled(Some(seed)).0,
        a,
        "the reported seed replays the answer"
    );
    assert_eq!(sampled(Some(5)).0, sampled(Some(5)).0);
    let r = s.post("/v1/chat/completions", &chat("x", 1));
    let created = r.json["created"].as_u64().unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(created <= now && created + 600 > now, "{created}");
    for (field, value, path) in [
        ("echo", json!(true), "/v1/completions"),
        ("suffix", json!("end"), "/v1/completions"),
        ("best_of", json!(3), "/v1/completions"),
        ("n", json!(0), "/v1/chat/completions"),
    ] {
        let mut body =
            json!({"prompt": "x", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1});
        body[field] = value;
        let r = s.post(path, &body);
        assert_eq!(
            (r.status, r.json["error"]["param"].clone()),
            (400, json!(field)),
            "{}",
            r.json
        );
    }
}

/// A raw request's status and head (lower-cased).
fn head_of(s: &Server, request: &str) -> (u16, String) {
    use std::io::Write;
    let mut c = s.raw();
    c.write_all(request.as_bytes()).unwrap();
    let head = common::server::read_head(&mut c).to_ascii_lowercase();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, head)
}

#[test]
fn browsers_get_cors_and_unknown_routes_get_openai_shaped_errors() {
    let s = Server::start(
        &fixture("trained/qwen3_moe"),
        &["--cors-origin", "https://ui.example"],
    );
    let preflight = |origin: &str| {
        format!("OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nOrigin: {origin}\r\nAccess-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: content-type, authorization\r\nConnection: close\r\n\r\n")
    };
    for origin in ["https://ui.example", "http://localhost:3000"] {
        let (status, head) = head_of(&s, &preflight(origin));
        assert_eq!(status, 204, "{origin}: {head}");
        assert!(
            head.contains(&format!("access-control-allow-origin: {origin}")),
            "{head}"
        );
        assert!(
            head.contains("access-control-allow-methods: get, post, options"),
            "{head}"
        );
        assert!(
            head.contains("access-control-allow-headers: content-type, authorization"),
            "{head}"
        );
    }
    let (status, head) = head_of(&s, &preflight("https://evil.example"));
    assert_eq!(status, 403, "{head}");
    assert!(!head.contains("access-control-allow-origin"), "{head}");
    // The answer itself is readable by the page.
    let body = r#"{"messages": [{"role": "user", "content": "x"}], "max_tokens": 1}"#;
    let post = format!("POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nOrigin: https://ui.example\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
    let (status, head) = head_of(&s, &post);
    assert_eq!(status, 200, "{head}");
    assert!(
        head.contains("access-control-allow-origin: https://ui.example"),
        "{head}"
    );
    assert!(head.contains("x-moestream-seed: "), "{head}");
    // 404 and 405 in the OpenAI shape.
    let (status, body) = s.get("/v1/nothing");
    assert_eq!(status, 404);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("/v1/nothing"),
        "{v}"
    );
    let (status, body) = s.get("/v1/chat/completions");
    assert_eq!(status, 405);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
}

/// A streamed Messages request's (event, data) pairs.
fn anthropic_events(s: &Server, body: &Value) -> Vec<(String, Value)> {
    use std::io::BufRead;
    let resp = ureq::post(&format!("{}/v1/messages", s.base))
        .set("x-api-key", "k")
        .set("anthropic-version", "2023-06-01")
        .send_json(body)
        .unwrap();
    let mut out = Vec::new();
    let mut event = String::new();
    for line in std::io::BufReader::new(resp.into_reader()).lines() {
        let line = line.unwrap();
        if let Some(e) = line.strip_prefix("event: ") {
            event = e.to_string();
        } else if let Some(d) = line.strip_prefix("data: ") {
            out.push((event.clone(), serde_json::from_str(d).unwrap()));
        }
    }
    out
}

fn anthropic_post(s: &Server, path: &str, body: &Value) -> common::server::Reply {
    s.post_with(
        path,
        body,
        &[("x-api-key", "k"), ("anthropic-version", "2023-06-01")],
    )
}

#[test]
fn the_messages_api_answers_whole_and_streamed_with_tools() {
    let s = Server::start_with_template(
        &fixture("trained/qwen3_moe"),
        &hermes(),
        &["--api-key", "k"],
    );
    let body = json!({"model": "ignored-is-checked", "max_tokens": 10, "temperature": 0,
        "system": "Be brief.", "messages": [{"role": "user", "content": "Hi."}]});
    let r = anthropic_post(&s, "/v1/messages", &body);
    assert_eq!(r.status, 404, "a model it does not serve: {}", r.json);
    assert_eq!(r.json["type"], "error");
    assert_eq!(r.json["error"]["type"], "not_found_error", "{}", r.json);
    let mut body = body;
    body.as_object_mut().unwrap().remove("model");
    let r = anthropic_post(&s, "/v1/messages", &body);
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(r.json["type"], "message");
    assert!(r.json["id"].as_str().unwrap().starts_with("msg_"));
    let text = r.json["content"][0]["text"].as_str().unwrap().to_string();
    assert!(["end_turn", "max_tokens"].contains(&r.json["stop_reason"].as_str().unwrap()));
    let input = r.json["usage"]["input_tokens"].as_u64().unwrap();
    let counted = anthropic_post(&s, "/v1/messages/count_tokens", &body);
    assert_eq!(
        counted.json["input_tokens"].as_u64(),
        Some(input),
        "{}",
        counted.json
    );

    // Streamed: Anthropic's event sequence, the same text.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let events = anthropic_events(&s, &streamed);
    let names: Vec<&str> = events.iter().map(|(e, _)| e.as_str()).collect();
    assert_eq!(
        &names[..3],
        ["message_start", "ping", "content_block_start"],
        "{names:?}"
    );
    assert_eq!(
        &names[names.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );
    assert!(
        names[3..names.len() - 3]
            .iter()
            .all(|n| *n == "content_block_delta"),
        "{names:?}"
    );
    let got: String = events
        .iter()
        .filter_map(|(_, d)| d["delta"]["text"].as_str())
        .collect();
    assert_eq!(got, text);
    for (e, d) in &events {
        assert_eq!(d["type"], e.as_str(), "{d}");
    }

    // A tool the client must call, then its result.
    let mut tools = body.clone();
    tools["tools"] = json!([{"name": "get_weather", "description": "The weather.",
        "input_schema": weather()["function"]["parameters"]}]);
    tools["tool_choice"] = json!({"type": "any", "disable_parallel_tool_use": true});
    tools["max_tokens"] = json!(120);
    let r = anthropic_post(&s, "/v1/messages", &tools);
    assert_eq!(r.json["stop_reason"], "tool_use", "{}", r.json);
    let used = r.json["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "tool_use")
        .unwrap()
        .clone();
    assert_eq!(used["name"], "get_weather");
    assert!(used["input"]["city"].is_string(), "{used}");
    let mut streamed = tools.clone();
    streamed["stream"] = json!(true);
    let events = anthropic_events(&s, &streamed);
    let partial: String = events
        .iter()
        .filter_map(|(_, d)| d["delta"]["partial_json"].as_str())
        .collect();
    assert_eq!(
        serde_json::from_str::<Value>(&partial).unwrap(),
        used["input"]
    );
    let stop = events.iter().find(|(e, _)| e == "message_delta").unwrap();
    assert_eq!(stop.1["delta"]["stop_reason"], "tool_use");
    let mut next = tools.clone();
    next["tool_choice"] = json!({"type": "auto"});
    next["messages"] = json!([
        {"role": "user", "content": "Hi."},
        {"role": "assistant", "content": [used]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": used["id"], "content": "sunny"}]},
    ]);
    let r = anthropic_post(&s, "/v1/messages", &next);
    assert_eq!(r.status, 200, "{}", r.json);
    assert!(r.json["usage"]["input_tokens"].as_u64().unwrap() > input);

    // Errors in Anthropic's shape; the key is checked.
    let mut bad = body.clone();
    bad.as_object_mut().unwrap().remove("max_tokens");
    let r = anthropic_post(&s, "/v1/messages", &bad);
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json["error"]["type"], "invalid_request_error",
        "{}",
        r.json
    );
    assert!(r.json["error"]["message"]
        .as_str()
        .unwrap()
        .contains("max_tokens"));
    let r = s.post_with("/v1/messages", &body, &[("x-api-key", "wrong")]);
    assert_eq!(r.status, 401);
}

/// `MOESTREAM_PYTHON=/path/to/venv/bin/python cargo test --test agents -- --ignored`
/// with `pip install openai` in that venv.
#[test]
#[ignore = "needs the openai Python package"]
fn openai_python_client_runs_a_tool_loop() {
    let s = Server::start_with_template(&fixture("trained/qwen3_moe"), &hermes(), &[]);
    run_client_script(
        "openai_client_check.py",
        &[format!("{}/v1", s.base), "--tools".into()],
    );
}

/// As above, with `pip install anthropic`.
#[test]
#[ignore = "needs the anthropic Python package"]
fn anthropic_python_client_runs_a_tool_loop() {
    let s = Server::start_with_template(
        &fixture("trained/qwen3_moe"),
        &hermes(),
        &["--api-key", "k"],
    );
    run_client_script("anthropic_client_check.py", &[s.base.clone(), "k".into()]);
}

/// The trained fixture's tokenizer prepared for constraints.
fn trained_grammars() -> moestream::engine::Grammars {
    let dir = fixture("trained/qwen3_moe");
    let bytes = std::fs::read(dir.join("tokenizer.json")).unwrap();
    let config: Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    let vocab = config["vocab_size"].as_u64().unwrap() as usize;
    moestream::engine::Grammars::new(&bytes, vocab, &[]).unwrap()
}

#[test]
fn the_rest_of_an_opened_call_is_held_to_the_tool_grammar_in_every_format() {
    use moestream::engine::Constraint;
    use moestream::formats::chat::tool_calls::{Tool, ToolFormat};
    let grammars = trained_grammars();
    let tools = [Tool {
        name: "get_weather".into(),
        parameters: weather()["function"]["parameters"].clone(),
    }];
    let args = r#"{"city": "Paris", "unit": "c"}"#;
    let cases = [
        (ToolFormat::Hermes, format!("<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {args}}}\n</tool_call>")),
        (ToolFormat::DeepSeek, format!("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{args}<｜tool▁call▁end｜><｜tool▁calls▁end｜>")),
        (ToolFormat::Glm, "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>unit</arg_key>\n<arg_value>c</arg_value>\n</tool_call>".to_string()),
        (ToolFormat::Mistral, format!("[TOOL_CALLS] [{{\"name\": \"get_weather\", \"arguments\": {args}}}]")),
    ];
    for (format, text) in cases {
        let marker = format.start_marker();
        let rest = text.strip_prefix(marker).unwrap();
        for parallel in [false, true] {
            let g = Constraint::Lark(format.grammar_after_marker(&tools, parallel));
            let state = grammars.start_with(&g, rest.as_bytes());
            assert!(state.is_ok(), "{format:?}: {rest:?}: {:?}", state.err());
            // The whole call under the forced grammar is the marker and this.
            let full = Constraint::Lark(format.grammar(&tools, parallel));
            assert!(
                grammars.start_with(&full, text.as_bytes()).is_ok(),
                "{format:?}"
            );
            // A call to a tool not offered, or arguments off the schema, is
            // not in the language.
            let wrong = rest.replace("get_weather", "get_wrong");
            assert!(
                grammars.start_with(&g, wrong.as_bytes()).is_err(),
                "{format:?}"
            );
            let off = rest.replace("\"c\"", "\"k\"").replace(">c<", ">k<");
            assert!(
                grammars.start_with(&g, off.as_bytes()).is_err(),
                "{format:?}: {off:?}"
            );
        }
        let done = grammars
            .start_with(
                &Constraint::Lark(format.grammar_after_marker(&tools, false)),
                rest.as_bytes(),
            )
            .unwrap();
        assert!(done.is_stopped(), "{format:?}: one call ends the output");
    }
}

#[test]
fn a_lazy_constraint_holds_from_its_trigger_and_leaves_the_output_before_alone() {
    use moestream::engine::generate::{generate, GenOptions};
    use moestream::engine::{Constrained, Constraint};
    let dir = fixture("trained/qwen3_moe");
    let opts = moestream::model::LoadOptions::default();
    let model = moestream::model::Model::load(&dir, &opts).unwrap();
    let tok = moestream::formats::tokenizer::Tokenizer::load(&dir).unwrap();
    let prompt = tok.encode_raw("The experts of a layer are").unwrap();
    let free = GenOptions {
        max_tokens: 24,
        sampling: Default::default(),
        ignore_eos: true,
        eos_ids: Vec::new(),
        speculation: Default::default(),
        constraint: None,
        logit_bias: Vec::new(),
    };
    let run = |o: &GenOptions| generate(&model, &prompt, o, |_| Ok(())).unwrap().token_ids;
    let greedy = run(&free);
    let text = tok.decode(&greedy).unwrap();
    // The trigger: the text of the first three tokens (mid-output, so
    // the constraint starts inside the answer).
    let head = tok.decode(&greedy[..3]).unwrap();
    let lazy = |after: &str| GenOptions {
        constraint: Some(Constrained {
            grammars: trained_grammars(),
            constraint: Constraint::Regex("[0-9]{4}".into()),
            after: after.as_bytes().to_vec(),
        }),
        ..free.clone()
    };
    let out = tok.decode(&run(&lazy(&head))).unwrap();
    assert!(out.starts_with(&head), "{out:?} vs {text:?}");
    let tail = &out[head.len()..];
    assert!(
        tail.len() == 4 && tail.bytes().all(|b| b.is_ascii_digit()),
        "after {head:?} the output is held to the regex and ends with it: {out:?}"
    );
    // A trigger the output never has changes nothing.
    assert_eq!(run(&lazy("\u{1}never\u{1}")), greedy);
}
