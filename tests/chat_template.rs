//! Chat templates against transformers: every case of
//! tests/fixtures/chat_templates/expected.json (rendered by
//! scripts/make_chat_fixtures.py with transformers' own apply_chat_template)
//! must render byte for byte the same here, and fail where transformers
//! failed. The committed templates were written for these tests in the
//! shape of each family's template (Qwen3, DeepSeek-V3, GLM, Mixtral,
//! OLMoE), plus two probes of the Python helpers. The models' real
//! templates are public data we do not redistribute: kept outside the
//! repository (`$MOESTREAM_REAL_TEMPLATES`, else `../shared/chat_templates`,
//! with their SOURCES.md and an expected.json made by the same script), they
//! are checked the same way when present.
//! Then `ChatTemplate::from_model_dir` on temporary model directories: each
//! form tokenizer_config.json gives a template and special tokens in.

use moestream::formats::chat::{ChatTemplate, Message, SpecialTokens};
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat_templates")
}

/// One case of expected.json.
#[derive(serde::Deserialize)]
struct Case {
    template: String,
    messages: Vec<Message>,
    add_generation_prompt: bool,
    expected: Option<String>,
    error: Option<String>,
    error_type: Option<String>,
}

/// The models' real templates, where this machine has them.
fn real_templates() -> Option<PathBuf> {
    let dir = match std::env::var_os("MOESTREAM_REAL_TEMPLATES") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/chat_templates"),
    };
    dir.join("expected.json").exists().then_some(dir)
}

/// The template `name` of `dir` with its special tokens (`name`.json).
fn load(dir: &Path, name: &str) -> ChatTemplate {
    let source = std::fs::read_to_string(dir.join(format!("{name}.jinja"))).unwrap();
    let tokens: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join(format!("{name}.json"))).unwrap())
            .unwrap();
    let token = |k: &str| tokens[k].as_str().map(str::to_string);
    let tokens = SpecialTokens {
        bos_token: token("bos_token"),
        eos_token: token("eos_token"),
    };
    ChatTemplate::new(source, tokens, format!("{name}.jinja")).unwrap()
}

/// What went wrong with one case, or None if it matched transformers.
fn check(template: &ChatTemplate, case: &Case) -> Option<String> {
    let got = template.render(&case.messages, case.add_generation_prompt);
    match (&case.expected, got) {
        (Some(want), Ok(got)) if *want == got => None,
        (Some(want), Ok(got)) => Some(format!("rendered\n{got:?}\ntransformers\n{want:?}")),
        (Some(_), Err(e)) => Some(format!("failed ({e}); transformers rendered it")),
        (None, Ok(got)) => Some(format!(
            "rendered {got:?}; transformers failed: {:?}",
            case.error
        )),
        (None, Err(e)) => check_error(case, &e.to_string()),
    }
}

/// Both failed: a template's own raise_exception must carry its message.
fn check_error(case: &Case, ours: &str) -> Option<String> {
    let raised = case.error_type.as_deref() == Some("TemplateError");
    let message = case.error.as_deref().unwrap_or_default();
    if raised && !ours.contains(message) {
        return Some(format!(
            "error {ours:?} lacks the template's message {message:?}"
        ));
    }
    None
}

#[test]
fn renders_as_transformers() {
    check_folder(&fixtures());
}

#[test]
fn the_models_real_templates_render_as_transformers() {
    match real_templates() {
        Some(dir) => check_folder(&dir),
        None => eprintln!(
            "the models' real templates are not on this machine (set MOESTREAM_REAL_TEMPLATES); checked the committed ones only"
        ),
    }
}

/// Checks every case of `dir`/expected.json.
fn check_folder(dir: &Path) {
    let text = std::fs::read_to_string(dir.join("expected.json")).unwrap();
    let cases: Vec<Case> = serde_json::from_str(&text).unwrap();
    assert!(
        cases.len() > 100,
        "expected.json holds {} cases",
        cases.len()
    );
    let mut templates = std::collections::BTreeMap::new();
    let mut failures = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let template = templates
            .entry(case.template.clone())
            .or_insert_with(|| load(dir, &case.template));
        if let Some(why) = check(template, case) {
            let agp = case.add_generation_prompt;
            failures.push(format!(
                "case {i} ({}, add_generation_prompt={agp}): {why}",
                case.template
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n\n")
    );
}

/// Every template in the folder has expected cases, and every case a template.
#[test]
fn every_fixture_template_is_checked() {
    let text = std::fs::read_to_string(fixtures().join("expected.json")).unwrap();
    let cases: Vec<Case> = serde_json::from_str(&text).unwrap();
    for entry in std::fs::read_dir(fixtures()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "jinja") {
            let name = path.file_stem().unwrap().to_str().unwrap();
            assert!(
                cases.iter().any(|c| c.template == name),
                "{name}.jinja has no cases"
            );
        }
    }
}

/// One case of tools/expected.json: messages as the client sends them
/// (tool calls, tool results, null content), the tools and the template's
/// keyword arguments.
#[derive(serde::Deserialize)]
struct ToolCase {
    template: String,
    messages: Vec<serde_json::Value>,
    tools: Option<serde_json::Value>,
    chat_template_kwargs: serde_json::Map<String, serde_json::Value>,
    add_generation_prompt: bool,
    expected: Option<String>,
    error: Option<String>,
}

/// The tool-calling templates (tests/fixtures/chat_templates/tools, in the
/// shape of Qwen3's, DeepSeek-V3.1's, GLM-4.5's and Mixtral-8x22B's)
/// render tools, calls, results and the thinking switches as
/// transformers' `apply_chat_template(messages, tools=..., **kwargs)` does.
#[test]
fn tool_calls_and_results_render_as_transformers() {
    let dir = fixtures().join("tools");
    let text = std::fs::read_to_string(dir.join("expected.json")).unwrap();
    let cases: Vec<ToolCase> = serde_json::from_str(&text).unwrap();
    assert!(cases.len() >= 50, "{} tool cases", cases.len());
    let mut failures = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let template = load(&dir, &case.template);
        let opts = moestream::formats::chat::RenderOptions {
            add_generation_prompt: case.add_generation_prompt,
            tools: case.tools.as_ref(),
            kwargs: Some(&case.chat_template_kwargs),
        };
        let got = template.render_json(&case.messages, &opts);
        let why = match (&case.expected, got) {
            (Some(want), Ok(got)) if *want == got => continue,
            (Some(want), Ok(got)) => format!("rendered\n{got:?}\ntransformers\n{want:?}"),
            (Some(_), Err(e)) => format!("failed ({e}); transformers rendered it"),
            (None, Ok(got)) => format!("rendered {got:?}; transformers failed: {:?}", case.error),
            (None, Err(e)) if e.to_string().contains(case.error.as_deref().unwrap_or("")) => {
                continue
            }
            (None, Err(e)) => format!("error {e} lacks {:?}", case.error),
        };
        failures.push(format!("case {i} ({}): {why}", case.template));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

fn model_dir(tokenizer_config: &serde_json::Value) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let text = serde_json::to_string_pretty(tokenizer_config).unwrap();
    std::fs::write(dir.path().join("tokenizer_config.json"), text).unwrap();
    dir
}

fn hello() -> Vec<Message> {
    vec![Message::new("user", "Hello")]
}

const SIMPLE: &str = "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{{ eos_token }}{% endfor %}";

#[test]
fn string_template_from_config() {
    let dir = model_dir(&serde_json::json!({
        "bos_token": "<s>", "eos_token": "</s>", "chat_template": SIMPLE,
    }));
    let t = ChatTemplate::from_model_dir(dir.path()).unwrap().unwrap();
    assert_eq!(t.render(&hello(), false).unwrap(), "<s>[user]Hello</s>");
    assert!(
        t.origin().contains("tokenizer_config.json"),
        "{}",
        t.origin()
    );
}

#[test]
fn named_templates_pick_default() {
    let dir = model_dir(&serde_json::json!({
        "eos_token": "</s>",
        "chat_template": [
            {"name": "tool_use", "template": "TOOLS"},
            {"name": "default", "template": SIMPLE},
            {"name": "rag", "template": "RAG"},
        ],
    }));
    let t = ChatTemplate::from_model_dir(dir.path()).unwrap().unwrap();
    assert_eq!(t.render(&hello(), false).unwrap(), "[user]Hello</s>");
}

#[test]
fn named_templates_without_default_are_refused() {
    let dir = model_dir(&serde_json::json!({
        "chat_template": [{"name": "tool_use", "template": "TOOLS"}],
    }));
    let err = ChatTemplate::from_model_dir(dir.path())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("chat_template") && err.contains("default"),
        "{err}"
    );
}

#[test]
fn no_template_is_none() {
    let dir = model_dir(&serde_json::json!({"eos_token": "</s>"}));
    assert!(ChatTemplate::from_model_dir(dir.path()).unwrap().is_none());
    let empty = tempfile::tempdir().unwrap();
    assert!(ChatTemplate::from_model_dir(empty.path())
        .unwrap()
        .is_none());
}

#[test]
fn added_token_objects_give_their_content() {
    let added = |content: &str| {
        serde_json::json!({
            "__type": "AddedToken", "content": content, "lstrip": false,
            "normalized": true, "rstrip": false, "single_word": false,
        })
    };
    let dir = model_dir(&serde_json::json!({
        "bos_token": added("<｜begin▁of▁sentence｜>"),
        "eos_token": added("<｜end▁of▁sentence｜>"),
        "chat_template": SIMPLE,
    }));
    let t = ChatTemplate::from_model_dir(dir.path()).unwrap().unwrap();
    assert_eq!(
        t.render(&hello(), false).unwrap(),
        "<｜begin▁of▁sentence｜>[user]Hello<｜end▁of▁sentence｜>"
    );
}

#[test]
fn broken_template_names_its_source() {
    let dir =
        model_dir(&serde_json::json!({"chat_template": "{% for m in messages %}{{ m.content }"}));
    let err = ChatTemplate::from_model_dir(dir.path())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("tokenizer_config.json") && err.contains("chat_template"),
        "{err}"
    );
    assert!(err.contains("syntax error"), "{err}");
}

#[test]
fn bad_token_field_names_the_field() {
    let dir = model_dir(&serde_json::json!({"bos_token": 3, "chat_template": SIMPLE}));
    let err = ChatTemplate::from_model_dir(dir.path())
        .unwrap_err()
        .to_string();
    assert!(err.contains("bos_token"), "{err}");
}

#[test]
fn jinja_file_wins_over_config() {
    let dir = model_dir(&serde_json::json!({"eos_token": "</s>", "chat_template": "CONFIG"}));
    std::fs::write(
        dir.path().join("chat_template.jinja"),
        "FILE{{ eos_token }}\n",
    )
    .unwrap();
    let t = ChatTemplate::from_model_dir(dir.path()).unwrap().unwrap();
    assert_eq!(t.render(&hello(), false).unwrap(), "FILE</s>");
    assert!(
        t.origin().ends_with("chat_template.jinja"),
        "{}",
        t.origin()
    );
}

#[test]
fn jinja_file_without_config() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("chat_template.jinja"), SIMPLE).unwrap();
    let t = ChatTemplate::from_model_dir(dir.path()).unwrap().unwrap();
    assert_eq!(t.render(&hello(), false).unwrap(), "[user]Hello");
}

#[test]
fn from_file_takes_tokens_from_the_model() {
    let dir = model_dir(
        &serde_json::json!({"bos_token": {"content": "<bos>"}, "chat_template": "CONFIG"}),
    );
    let file = dir.path().join("override.jinja");
    std::fs::write(&file, SIMPLE).unwrap();
    let t = ChatTemplate::from_file(&file, dir.path()).unwrap();
    assert_eq!(t.render(&hello(), false).unwrap(), "<bos>[user]Hello");
    let missing = ChatTemplate::from_file(&dir.path().join("absent.jinja"), dir.path());
    assert!(missing.unwrap_err().to_string().contains("absent.jinja"));
}

#[test]
fn template_refusal_names_source_and_message() {
    let t = load(&fixtures(), "mixtral_style");
    let err = t
        .render(
            &[Message::new("system", "s"), Message::new("user", "u")],
            true,
        )
        .unwrap_err()
        .to_string();
    assert!(err.contains("mixtral_style.jinja"), "{err}");
    assert!(err.contains("Conversation roles must alternate"), "{err}");
}

/// A rendered prompt goes to the tokenizer without added special tokens.
#[test]
fn rendered_prompt_encodes_raw() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen3_moe");
    let tok = moestream::formats::tokenizer::Tokenizer::load(&dir).unwrap();
    let prompt = load(&fixtures(), "qwen3_style")
        .render(&hello(), true)
        .unwrap();
    let ids = tok.encode_raw(&prompt).unwrap();
    assert!(!ids.is_empty());
    assert_eq!(tok.encode_raw("").unwrap(), Vec::<u32>::new());
}

/// Renders `source` over `messages` in this process: a hostile template
/// that allocates gigabytes would abort the test binary (rc 134) here.
fn hostile(source: &str, messages: &[Message]) -> String {
    let t = ChatTemplate::new(
        source.into(),
        SpecialTokens::default(),
        "hostile.jinja".into(),
    )
    .unwrap();
    let err = t
        .render(messages, true)
        .expect_err("a hostile template rendered");
    err.to_string()
}

#[test]
fn hostile_templates_hit_the_memory_bound_not_an_abort() {
    let cases = [
        "{{ messages | tojson(indent=10**15) }}",
        "{{ messages | tojson(indent='x' * 10**7) }}",
        "{{ messages[0].content | indent(10**15) }}",
        "{{ 'a\\nb' | indent(width=10**12, first=true) }}",
        "{{ '%1000000000000s' | format('x') }}",
        "{{ '{:>1000000000000}'.format('x') }}",
        "{% set s = 'x' * 10**8 %}{% for i in range(100000) %}{{ s }}{% endfor %}",
        "{% set s %}{% for i in range(100000) %}{{ 'y' * 10**7 }}{% endfor %}{% endset %}",
        "{{ (['x'] * 10**12) | join(',') }}",
        "{{ (['x'] * 10**12) | list | length }}",
        "{{ ['x'] * 10**12 }}",
        "{{ 'ab' | replace('', 'x' * 10**8) }}",
        "{{ ('ab' * 10**6).replace('a', 'x' * 10**4) }}",
        "{{ [1] | slice(10**12) | list }}",
    ];
    let hi = [Message::new("user", "hi\nthere")];
    for source in cases {
        let text = hostile(source, &hi);
        assert!(
            text.contains("hostile.jinja")
                && (text.contains("memory bound") || text.contains("over the limit")),
            "{source}: {text}"
        );
    }
}

#[test]
fn unprinted_operator_growth_hits_the_memory_bound_not_an_abort() {
    // Each doubles (or grows by a big message) per iteration without
    // printing: 2^60 bytes unbounded, refused at the render's bound.
    let cases = [
        "{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}",
        "{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s | length }}",
        "{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s * 2 %}{% endfor %}{{ ns.s | length }}",
        "{% set ns = namespace(s='ab', t='') %}{% for i in range(60) %}{% set ns.t = ns.s %}{% set ns.s = ns.t ~ ns.s %}{% endfor %}{{ ns.s | length }}",
        "{% set ns = namespace(l=[1]) %}{% for i in range(60) %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l | length }}",
        "{% macro d(s, n) %}{% if n %}{{ d(s ~ s, n - 1) }}{% else %}{{ s | length }}{% endif %}{% endmacro %}{{ d('ab', 60) }}",
        "{% set ns = namespace(s='') %}{% for i in range(100000) %}{% set ns.s = ns.s ~ messages[0].content %}{% endfor %}{{ ns.s | length }}",
        "{{ ('x' * 10**7) ~ ('x' * 10**7) ~ ('x' * 10**7) }}",
    ];
    let big = [Message::new("user", "m".repeat(1 << 20))];
    for source in cases {
        let text = hostile(source, &big);
        assert!(
            text.contains("hostile.jinja") && text.contains("memory bound"),
            "{source}: {text}"
        );
    }
}

#[test]
fn double_loop_over_client_messages_hits_the_memory_bound() {
    // 4000 messages of 1 KiB: 4 MiB in, 16 GiB out through a double loop.
    let big: Vec<Message> = (0..4000)
        .map(|_| Message::new("user", "z".repeat(1024)))
        .collect();
    let source =
        "{% for a in messages %}{% for b in messages %}{{ b.content }}{% endfor %}{% endfor %}";
    let text = hostile(source, &big);
    assert!(text.contains("memory bound"), "{text}");
}

#[test]
fn gguf_template_errors_name_the_metadata_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf/qwen3moe-Q4_0.gguf");
    let f = moestream::formats::gguf::file::GgufFile::open(&src).unwrap();
    let mut meta: Vec<(String, moestream::formats::gguf::file::Value)> =
        f.metadata.clone().into_iter().collect();
    meta.sort_by(|a, b| a.0.cmp(&b.0));
    for (k, v) in &mut meta {
        if k == "tokenizer.chat_template" {
            *v = moestream::formats::gguf::file::Value::Str(
                "{{ messages | tojson(indent=10**15) }}".into(),
            );
        }
    }
    moestream::convert::gguf_write::write_gguf(&path, &meta, &[], |_, _| Ok(())).unwrap();
    let t = ChatTemplate::from_model_dir(&path)
        .unwrap()
        .expect("a template");
    let err = t.render(&hello(), true).unwrap_err().to_string();
    assert!(
        err.contains("GGUF metadata tokenizer.chat_template") && err.contains("over the limit"),
        "{err}"
    );
}

#[test]
fn real_template_shapes_still_render_under_the_bound() {
    let t = ChatTemplate::new(
        "{% for m in messages %}{{ m.role | indent(2) }}{{ '%-4s' | format('x') }}{{ m.content | replace('a', 'bb') }}{{ messages | tojson(indent=2) | length > 0 }}{{ ['a', 'b'] | join(', ') }}{{ ' q '.strip().replace('q', 'r') }}{% endfor %}".into(),
        SpecialTokens::default(),
        "ok".into(),
    )
    .unwrap();
    let big = "a".repeat(1 << 20);
    let out = t.render(&[Message::new("user", big)], true).unwrap();
    assert!(out.starts_with("userx   bbbb"), "{}", &out[..40]);
}
