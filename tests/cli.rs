//! The command line as llama.cpp and Ollama users type it: short flags and
//! aliases give the same tokens as the long spellings, the prompt comes
//! from a file or standard input, `run --chat` renders the chat template
//! as the server does, and `-h` groups the flags under headings.

mod common;

use common::{fixture, moestream, Out};
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

fn model() -> String {
    fixture("qwen3_moe").to_str().unwrap().to_string()
}

/// `run ARGS --json`: (prompt_ids, token_ids), failing the test on an error.
fn run_ids(args: &[&str]) -> (Vec<u64>, Vec<u64>) {
    let mut all = vec!["run"];
    all.extend(args);
    all.push("--json");
    ids_of(&moestream(&all), args)
}

fn ids_of(out: &Out, args: &[&str]) -> (Vec<u64>, Vec<u64>) {
    assert!(out.ok, "{args:?}: {}", out.stderr);
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("one JSON object");
    let list = |k: &str| -> Vec<u64> {
        v[k].as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect()
    };
    (list("prompt_ids"), list("token_ids"))
}

/// `run ARGS --json` with `stdin` on standard input.
fn run_ids_stdin(args: &[&str], stdin: &str) -> (Vec<u64>, Vec<u64>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_moestream"))
        .arg("run")
        .args(args)
        .arg("--json")
        .env("MOESTREAM_NO_HISTORY", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = common::wait_within(child, 120, "run with a prompt on stdin");
    let out = Out {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    ids_of(&out, args)
}

#[test]
fn short_flags_aliases_and_a_positional_model_match_the_long_flags() {
    let m = model();
    let long = run_ids(&[
        "--model",
        &m,
        "--prompt",
        "hello world",
        "--max-tokens",
        "4",
        "--context",
        "64",
        "--threads",
        "1",
    ]);
    assert_eq!(long.1.len(), 4);
    let spellings: [&[&str]; 4] = [
        &[
            "-m",
            &m,
            "-p",
            "hello world",
            "-n",
            "4",
            "-c",
            "64",
            "-t",
            "1",
        ],
        &[
            &m,
            "-p",
            "hello world",
            "--n-predict",
            "4",
            "--ctx-size",
            "64",
        ],
        &["-p", "hello world", &m, "-n", "4"],
        &["--model", &m, "-p", "hello world", "-n", "4", "--temp", "0"],
    ];
    for args in spellings {
        assert_eq!(run_ids(args), long, "{args:?}");
    }
    // Sampling: --temp and -s are --temperature and --seed.
    let sampled = |args: &[&str]| {
        let mut all = vec!["-m", &m, "-p", "hello world", "-n", "6"];
        all.extend(args);
        run_ids(&all)
    };
    assert_eq!(
        sampled(&["--temp", "1.5", "-s", "7"]),
        sampled(&["--temperature", "1.5", "--seed", "7"])
    );
}

#[test]
fn the_prompt_comes_from_a_file_or_standard_input() {
    let m = model();
    let want = run_ids(&["-m", &m, "-p", "a file\nof two lines", "-n", "3"]);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("prompt.txt");
    // One trailing newline is dropped, as llama.cpp's -f does.
    std::fs::write(&file, "a file\nof two lines\n").unwrap();
    let f = file.to_str().unwrap();
    assert_eq!(run_ids(&["-m", &m, "-f", f, "-n", "3"]), want);
    assert_eq!(run_ids(&["-m", &m, "--file", f, "-n", "3"]), want);
    let piped = "a file\nof two lines\n";
    assert_eq!(
        run_ids_stdin(&["-m", &m, "-p", "-", "-n", "3"], piped),
        want
    );
    assert_eq!(
        run_ids_stdin(&["-m", &m, "-f", "-", "-n", "3"], piped),
        want
    );
    // A missing file is named.
    let out = moestream(&["run", "-m", &m, "-f", "/nonexistent/p.txt"]);
    common::assert_clean_failure(&out, &["--file /nonexistent/p.txt"]);
}

#[test]
fn run_chat_renders_the_template_as_the_server_does() {
    use moestream::formats::chat::{ChatTemplate, Message};
    use moestream::formats::tokenizer::Tokenizer;
    let m = fixture("qwen3_moe");
    let dir = tempfile::tempdir().unwrap();
    let template = dir.path().join("chat.jinja");
    std::fs::write(&template, CHATML).unwrap();
    let t = template.to_str().unwrap();
    let ms = m.to_str().unwrap();
    let (prompt, tokens) = run_ids(&[
        "-m",
        ms,
        "--chat",
        "--system",
        "be brief",
        "--chat-template",
        t,
        "-p",
        "what is a cache?",
        "-n",
        "3",
    ]);
    assert_eq!(tokens.len(), 3);
    // The server's chat path: render with the assistant's turn opened,
    // tokenize without adding special tokens (src/server/respond.rs).
    let messages = [
        Message::new("system", "be brief"),
        Message::new("user", "what is a cache?"),
    ];
    let text = ChatTemplate::from_file(&template, &m)
        .unwrap()
        .render(&messages, true)
        .unwrap();
    assert!(text.ends_with("<|im_start|>assistant\n"), "{text}");
    let want: Vec<u64> = Tokenizer::load(&m)
        .unwrap()
        .encode_raw(&text)
        .unwrap()
        .into_iter()
        .map(u64::from)
        .collect();
    assert_eq!(prompt, want);
    let plain = run_ids(&["-m", ms, "-p", "what is a cache?", "-n", "3"]);
    assert_ne!(plain.0, prompt, "--chat changes the prompt");
    // The fixture has no template of its own: without --chat-template,
    // --chat is refused with the fix.
    let out = moestream(&["run", "-m", ms, "--chat", "-p", "hi"]);
    common::assert_clean_failure(&out, &["chat template", "--chat-template"]);
}

#[test]
fn run_help_groups_the_flags_under_headings() {
    let out = moestream(&["run", "-h"]);
    assert!(out.ok, "{}", out.stderr);
    let at = |needle: &str| {
        out.stdout
            .find(needle)
            .unwrap_or_else(|| panic!("`{needle}` in: {}", out.stdout))
    };
    let headings = ["Generation:", "Model:", "Memory and I/O:", "Research:"];
    let pos: Vec<usize> = headings.iter().map(|h| at(h)).collect();
    assert!(pos.windows(2).all(|w| w[0] < w[1]), "{}", out.stdout);
    // The flags a user types first come before the research knobs.
    for flag in ["--prompt", "--max-tokens", "--temperature"] {
        assert!(at(flag) < pos[1], "{flag} under Generation");
    }
    assert!(at("--ram-gb") > pos[2] && at("--ram-gb") < pos[3]);
    assert!(at("--prefetch-depth") > pos[3]);
}

#[test]
fn the_model_is_required_and_given_once() {
    let m = model();
    let out = moestream(&["run", "-p", "hi"]);
    common::assert_clean_failure(&out, &["--model"]);
    let out = moestream(&["run", "-m", &m, &m, "-p", "hi"]);
    common::assert_clean_failure(&out, &["--model"]);
    assert!(Path::new(&m).is_dir());
}

#[test]
fn cli_errors_have_no_bad_request_prefix_and_name_a_missing_model() {
    let m = model();
    let out = moestream(&["run", "-m", &m, "-p", ""]);
    common::assert_clean_failure(&out, &["the prompt is empty"]);
    assert!(!out.stderr.contains("bad request"), "{}", out.stderr);
    let out = moestream(&["run", "-m", "/nonexistent/dir", "-p", "hi"]);
    common::assert_clean_failure(&out, &["--model /nonexistent/dir", "No such file"]);
    assert!(!out.stderr.contains("tokenizer.json"), "{}", out.stderr);
}

#[test]
fn logs_follow_the_flags_then_rust_log_as_text_or_json() {
    let m = model();
    let args = ["run", "-m", &m, "-p", "hi", "-n", "1"];
    let with = |extra: &[&str], env: &[(&str, &str)]| {
        let mut all = args.to_vec();
        all.extend(extra);
        let mut env = env.to_vec();
        env.push(("MOESTREAM_NO_HISTORY", "1"));
        let out = common::moestream_env(&all, &env);
        assert!(out.ok, "{extra:?} {env:?}: {}", out.stderr);
        out.stderr
    };
    let loaded = "model loaded";
    assert!(!with(&[], &[("RUST_LOG", "")]).contains(loaded));
    assert!(with(&["-v"], &[]).contains(loaded));
    assert!(with(&[], &[("RUST_LOG", "moestream=info")]).contains(loaded));
    // Flags beat the environment.
    assert!(!with(&["-q"], &[("RUST_LOG", "info")]).contains(loaded));
    let json = with(&["-v", "--log-format", "json"], &[]);
    let line = json
        .lines()
        .find(|l| l.contains(loaded))
        .unwrap_or_else(|| panic!("{json}"));
    let v: serde_json::Value = serde_json::from_str(line).expect("a JSON log line");
    assert_eq!(v["level"], "INFO", "{line}");
    assert_eq!(v["fields"]["message"], loaded, "{line}");
    assert_eq!(v["fields"]["family"], "qwen3_moe", "{line}");
}

#[test]
fn version_names_the_commit_profile_and_kernels() {
    let out = moestream(&["--version"]);
    assert!(out.ok, "{}", out.stderr);
    let v = &out.stdout;
    assert!(
        v.starts_with(&format!("moestream {}", env!("CARGO_PKG_VERSION"))),
        "{v}"
    );
    for key in ["commit ", "profile ", "kernels "] {
        assert!(v.contains(key), "`{key}` in {v}");
    }
    assert!(v.contains("debug") || v.contains("release"), "{v}");
    let commit = v
        .lines()
        .find_map(|l| l.strip_prefix("commit"))
        .unwrap()
        .trim();
    assert!(
        commit == "unknown" || commit.chars().all(|c| c.is_ascii_hexdigit()),
        "{commit}"
    );
}

#[test]
fn completions_and_the_man_page_are_generated() {
    for shell in ["bash", "zsh", "fish"] {
        let out = moestream(&["completions", shell]);
        assert!(out.ok, "{shell}: {}", out.stderr);
        assert!(out.stdout.contains("moestream"), "{shell}");
        assert!(
            out.stdout.contains("ram-gb"),
            "{shell}: flags of subcommands"
        );
    }
    let out = moestream(&["completions", "nosuchshell"]);
    common::assert_clean_failure(&out, &["nosuchshell"]);
    let out = moestream(&["man"]);
    assert!(out.ok, "{}", out.stderr);
    assert!(
        out.stdout.starts_with(".ie") || out.stdout.contains(".TH"),
        "roff"
    );
    assert!(out.stdout.contains("moestream"));
}

/// The libraries an ELF file names in its dynamic section (DT_NEEDED),
/// read from the file: no `ldd` needed.
fn needed_libraries(elf: &[u8]) -> Vec<String> {
    let u16_at = |o: usize| u16::from_le_bytes(elf[o..o + 2].try_into().unwrap()) as usize;
    let u32_at = |o: usize| u32::from_le_bytes(elf[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(elf[o..o + 8].try_into().unwrap());
    assert_eq!(&elf[..4], b"\x7fELF");
    assert_eq!((elf[4], elf[5]), (2, 1), "64-bit little-endian ELF");
    let (phoff, phentsize, phnum) = (u64_at(0x20) as usize, u16_at(0x36), u16_at(0x38));
    let headers: Vec<usize> = (0..phnum).map(|i| phoff + i * phentsize).collect();
    // (vaddr, offset, filesz) of each PT_LOAD, to map addresses to bytes.
    let loads: Vec<(u64, u64, u64)> = headers
        .iter()
        .filter(|&&h| u32_at(h) == 1)
        .map(|&h| (u64_at(h + 0x10), u64_at(h + 0x08), u64_at(h + 0x20)))
        .collect();
    let to_offset = |addr: u64| {
        let (v, o, _) = loads
            .iter()
            .find(|(v, _, n)| (*v..v + n).contains(&addr))
            .expect("address inside a PT_LOAD");
        (addr - v + o) as usize
    };
    let Some(&dynamic) = headers.iter().find(|&&h| u32_at(h) == 2) else {
        return Vec::new(); // statically linked
    };
    let (off, size) = (
        u64_at(dynamic + 0x08) as usize,
        u64_at(dynamic + 0x20) as usize,
    );
    let entries: Vec<(u64, u64)> = (off..off + size)
        .step_by(16)
        .map(|e| (u64_at(e), u64_at(e + 8)))
        .take_while(|&(tag, _)| tag != 0)
        .collect();
    let strtab = entries.iter().find(|e| e.0 == 5).expect("DT_STRTAB").1;
    let strtab = to_offset(strtab);
    entries
        .iter()
        .filter(|e| e.0 == 1)
        .map(|&(_, name)| {
            let start = strtab + name as usize;
            let end = start + elf[start..].iter().position(|&b| b == 0).unwrap();
            String::from_utf8_lossy(&elf[start..end]).into_owned()
        })
        .collect()
}

#[test]
fn the_binary_links_only_the_c_runtime() {
    let elf = std::fs::read(env!("CARGO_BIN_EXE_moestream")).unwrap();
    let needed = needed_libraries(&elf);
    assert!(!needed.is_empty(), "a dynamically linked binary names libc");
    let allowed = [
        "libc.so",
        "libm.so",
        "libgcc_s.so",
        "ld-linux",
        "libpthread.so",
        "libdl.so",
        "librt.so",
    ];
    for lib in &needed {
        assert!(
            allowed.iter().any(|a| lib.starts_with(a)),
            "{lib} is not the C runtime (all: {needed:?}); a minimal Rust image could not build or run this"
        );
    }
}

/// `run -m M -p hi --ignore-eos --json ARGS` with `env` and `config` (a
/// TOML file passed as --config): the number of tokens generated.
fn tokens_with(args: &[&str], env: &[(&str, &str)], config: Option<&str>) -> Result<usize, String> {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("moestream.toml");
    let m = model();
    let mut all = vec!["run", "-m", &m, "-p", "hi", "--ignore-eos", "--json"];
    let file_s = file.to_str().unwrap().to_string();
    if let Some(text) = config {
        std::fs::write(&file, text).unwrap();
        all.extend(["--config", &file_s]);
    }
    all.extend(args);
    let mut env = env.to_vec();
    env.push(("MOESTREAM_NO_HISTORY", "1"));
    let out = common::moestream_env(&all, &env);
    if !out.ok {
        return Err(out.stderr);
    }
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("one JSON object");
    Ok(v["token_ids"].as_array().unwrap().len())
}

/// (flags, environment, config file, tokens generated).
type Row<'a> = (
    &'a [&'a str],
    &'a [(&'a str, &'a str)],
    Option<&'a str>,
    usize,
);

/// Flag > MOESTREAM_<FLAG> > --config file (its command's section over
/// its top level) > default, the same table for every flag.
#[test]
fn settings_come_from_the_flag_then_the_environment_then_the_file() {
    let env = [("MOESTREAM_MAX_TOKENS", "3")];
    let file = "max-tokens = 5\n";
    let sectioned = "max_tokens = 5\n[run]\nmax-tokens = 6\n[serve]\nport = 1\n";
    // (flags, environment, file) -> tokens
    let table: [Row; 7] = [
        (&[], &[], None, 64),
        (&[], &env, None, 3),
        (&["-n", "2"], &env, None, 2),
        (&[], &[], Some(file), 5),
        (&[], &[], Some(sectioned), 6),
        (&[], &env, Some(file), 3),
        (&["--max-tokens", "4"], &env, Some(file), 4),
    ];
    for (i, (args, env, config, want)) in table.into_iter().enumerate() {
        assert_eq!(tokens_with(args, env, config), Ok(want), "row {i}");
    }
    // The file named by the environment, and a switch from it.
    let tmp = tempfile::tempdir().unwrap();
    let f = tmp.path().join("c.toml");
    std::fs::write(&f, "max-tokens = 7\n").unwrap();
    let via_env = [("MOESTREAM_CONFIG", f.to_str().unwrap())];
    assert_eq!(tokens_with(&[], &via_env, None), Ok(7));
}

#[test]
fn a_bad_setting_outside_the_command_line_is_refused_by_name() {
    let err = |env: &[(&str, &str)], config: Option<&str>| {
        tokens_with(&["-n", "1"], env, config).expect_err("refused")
    };
    let e = err(&[], Some("max-tokens = 2\nmax-tokenz = 3\n"));
    assert!(
        e.contains("moestream.toml") && e.contains("`max-tokenz`"),
        "{e}"
    );
    let e = err(&[], Some("[run]\nport = 8\n"));
    assert!(
        e.contains("`run.port`") && e.contains("moestream.toml"),
        "{e}"
    );
    let e = err(&[], Some("[runn]\nseed = 1\n"));
    assert!(e.contains("[runn]"), "{e}");
    let e = err(&[], Some("seed = \"many\"\n"));
    assert!(e.contains("`seed`") && e.contains("many"), "{e}");
    let e = err(&[("MOESTREAM_TEMPERATURE", "hot")], None);
    assert!(
        e.contains("MOESTREAM_TEMPERATURE") && e.contains("hot"),
        "{e}"
    );
    let e = err(&[], Some("this is not toml ="));
    assert!(
        e.contains("moestream.toml") && e.starts_with("error: "),
        "{e}"
    );
}

/// With no --ram-gb inside a memory cgroup, the budget printed at start is
/// the cgroup's limit less the margin, and the run succeeds inside it.
#[test]
fn the_automatic_budget_follows_the_memory_cgroup() {
    let limit: u64 = 600_000_000;
    let Some(g) = common::MemoryCgroup::create(limit) else {
        eprintln!(
            "skipped: no cgroup-v1 memory group could be created under /sys/fs/cgroup/memory"
        );
        return;
    };
    let m = model();
    let out = g.run(&["run", "-m", &m, "-p", "hi", "-n", "4", "--json"]);
    assert!(out.ok, "{}", out.stderr);
    let want = moestream::machine::memory::budget_from(Some(limit), None).unwrap();
    let line = format!("memory: budget {want}");
    assert!(out.stderr.contains(&line), "`{line}` in: {}", out.stderr);
    assert!(
        out.stderr.contains("the memory cgroup limit 0.60 GB"),
        "{}",
        out.stderr
    );
    assert!(
        !g.read("memory.oom_control").contains("oom_kill 1"),
        "OOM-killed"
    );
    let peak: u64 = g.read("memory.max_usage_in_bytes").trim().parse().unwrap();
    assert!(peak <= limit, "cgroup peak {peak}");
}

/// `plan` and `doctor` plan a budget with the same call: the same smallest
/// budget, with and without --ram-gb.
#[test]
fn plan_and_doctor_name_the_same_smallest_budget() {
    let m = model();
    let smallest_of = |text: &str, needle: &str| -> String {
        let at = text
            .find(needle)
            .unwrap_or_else(|| panic!("`{needle}` in: {text}"));
        text[at + needle.len()..]
            .split(|c: char| !(c.is_ascii_digit() || c == '.'))
            .next()
            .unwrap()
            .to_string()
    };
    for budget in [None, Some("2")] {
        let mut plan = vec!["plan", "-m", &m, "--probe-seconds", "0"];
        let mut doctor = vec!["doctor", "--model", &m, "--probe-seconds", "0"];
        if let Some(b) = budget {
            plan.extend(["--ram-gb", b]);
            doctor.extend(["--ram-gb", b]);
        }
        let p = moestream(&plan);
        assert!(p.ok, "{}", p.stderr);
        let d = moestream(&doctor);
        let from_plan = smallest_of(&p.stdout, "smallest budget that runs: --ram-gb ");
        let from_doctor = smallest_of(&d.stdout, "the smallest budget that runs is --ram-gb ");
        assert_eq!(from_plan, from_doctor, "{}\n{}", p.stdout, d.stdout);
    }
}

/// `synth --geometry` with fewer experts than its default knobs reach
/// moves them into reach and says so; a value given out of reach stays an
/// error naming the flag's knob.
#[test]
fn synth_defaults_fit_a_small_geometry_and_say_so() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    let d = dir.to_str().unwrap();
    let geometry = [
        "synth",
        "--geometry",
        "qwen3-30b-a3b",
        "--experts",
        "16",
        "--layers",
        "2",
    ];
    let mut args = geometry.to_vec();
    args.extend(["--vocab", "512", "--out", d]);
    let out = moestream(&args);
    assert!(out.ok, "{}", out.stderr);
    assert!(
        out.stderr.contains("note:") && out.stderr.contains("--lookahead-recall"),
        "{}",
        out.stderr
    );
    assert!(dir.join("config.json").exists());
    let dir2 = tmp.path().join("m2");
    let mut args = geometry.to_vec();
    args.extend([
        "--vocab",
        "512",
        "--lookahead-recall",
        "0.5",
        "--out",
        dir2.to_str().unwrap(),
    ]);
    let out = moestream(&args);
    common::assert_clean_failure(&out, &["lookahead recall", "out of reach"]);
}

/// `status` shows the settings that come from outside the command line.
#[test]
fn status_shows_the_environment_and_the_config_file() {
    let tmp = tempfile::tempdir().unwrap();
    let f = tmp.path().join("c.toml");
    std::fs::write(&f, "ram-gb = 8\n[serve]\nport = 9000\n").unwrap();
    let f = f.to_str().unwrap();
    let out = common::moestream_env(
        &["status", "--config", f],
        &[("MOESTREAM_TEMPERATURE", "0.5")],
    );
    assert!(out.ok, "{}", out.stderr);
    for needle in [
        "MOESTREAM_TEMPERATURE=0.5",
        "ram-gb = 8",
        "serve.port = 9000",
        f,
    ] {
        assert!(out.stdout.contains(needle), "`{needle}` in: {}", out.stdout);
    }
}
