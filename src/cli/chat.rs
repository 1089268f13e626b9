//! `moestream chat`: a conversation in the terminal. Each answer streams
//! as it is generated; the conversation's KV stays between turns (a turn
//! prefills only what the template added since the last one). Multi-line
//! input: end a line with `\` to continue it, or enclose lines in `"""`.
//! Commands: /reset, /stats, /exit. Ctrl-C stops the answer being
//! generated; at the prompt it ends the program (as does Ctrl-D).

use super::serve::chat_template_required;
use super::*;
use moestream::engine::{Engine, Prefix, Session};
use moestream::formats::chat::{ChatTemplate, Message};
use moestream::model::profile::Profile;
use std::io::BufRead;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

#[derive(Args)]
#[command(next_help_heading = H_GEN)]
pub(super) struct ChatArgs {
    /// A Jinja chat template to use instead of the model's.
    #[arg(long, value_name = "FILE")]
    chat_template: Option<PathBuf>,
    /// A system message opening the conversation.
    #[arg(long)]
    system: Option<String>,
    /// New tokens per answer at most.
    #[arg(short = 'n', long, visible_alias = "n-predict", default_value_t = 512)]
    max_tokens: usize,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    spec: SpecArgs,
    #[command(flatten)]
    pub(super) model: ModelArgs,
}

/// Set while an answer is generated: Ctrl-C then stops it.
static GENERATING: AtomicBool = AtomicBool::new(false);
/// Set by Ctrl-C during an answer.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    if GENERATING.load(Ordering::SeqCst) {
        STOP.store(true, Ordering::SeqCst);
    } else {
        // SAFETY: _exit is async-signal-safe; nothing is left to flush at
        // the prompt.
        unsafe { libc::_exit(130) };
    }
}

fn install_sigint() {
    let handler: extern "C" fn(libc::c_int) = on_sigint;
    // SAFETY: a zeroed sigaction with a handler that only touches atomics
    // or calls _exit; installed once, before any other thread reads input.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGINT, &sa, std::ptr::null_mut());
    }
}

/// One conversation: its messages and the KV of what was computed.
struct Chat<'m> {
    model: &'m Model,
    tok: Tokenizer,
    template: ChatTemplate,
    opts: GenOptions,
    system: Option<String>,
    messages: Vec<Message>,
    prefix: Option<Prefix>,
    last: Option<TurnStats>,
}

/// The figures of one answer (/stats).
struct TurnStats {
    prompt: usize,
    reused: usize,
    tokens: usize,
    seconds: f64,
    hits: u64,
    misses: u64,
    stopped: bool,
}

pub(super) fn cmd_chat(a: ChatArgs) -> Result<()> {
    let dir = a.model.model.clone();
    let tok = Tokenizer::load(&dir)?;
    let template = chat_template_required(a.chat_template.as_deref(), &dir)?;
    let defaults = GenerationDefaults::load(&dir)?;
    let opts = GenOptions {
        max_tokens: a.max_tokens,
        sampling: defaults.sampling(&SamplingParams::default(), &a.sampling.overrides()),
        eos_ids: defaults.eos_ids.clone(),
        speculation: a.spec.speculation(),
        ..GenOptions::default()
    };
    opts.sampling.validate().map_err(anyhow::Error::msg)?;
    let model = load(&a.model)?;
    let mut chat = Chat {
        model: &model,
        tok,
        template,
        opts,
        system: a.system.clone(),
        messages: Vec::new(),
        prefix: None,
        last: None,
    };
    chat.reset();
    install_sigint();
    eprintln!("chat with {} (/reset, /stats, /exit; end a line with \\ or enclose lines in \"\"\" for more lines)", dir.display());
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    while let Some(text) = read_message(&mut input)? {
        match text.trim() {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                chat.reset();
                eprintln!("[conversation cleared]");
            }
            "/stats" => chat.print_stats(),
            _ => chat.turn(&text)?,
        }
    }
    Ok(())
}

/// Reads one message: a line, lines joined by a trailing `\`, or the lines
/// between two `"""` lines. None at end of input.
fn read_message(input: &mut impl BufRead) -> Result<Option<String>> {
    eprint!("> ");
    let mut line = String::new();
    if input.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    if line.trim_end() == "\"\"\"" {
        let mut block = String::new();
        loop {
            let mut l = String::new();
            if input.read_line(&mut l)? == 0 || l.trim_end() == "\"\"\"" {
                return Ok(Some(block.trim_end_matches('\n').to_string()));
            }
            block.push_str(&l);
        }
    }
    let mut text = String::new();
    loop {
        let l = line.trim_end_matches(['\n', '\r']);
        match l.strip_suffix('\\') {
            Some(head) => {
                text.push_str(head);
                text.push('\n');
                line.clear();
                if input.read_line(&mut line)? == 0 {
                    return Ok(Some(text));
                }
            }
            None => {
                text.push_str(l);
                return Ok(Some(text));
            }
        }
    }
}

impl Chat<'_> {
    fn reset(&mut self) {
        self.messages.clear();
        if let Some(s) = &self.system {
            self.messages.push(Message::new("system", s.clone()));
        }
    }

    /// One user message and the streamed answer.
    fn turn(&mut self, text: &str) -> Result<()> {
        self.messages.push(Message::new("user", text));
        let rendered = self.template.render(&self.messages, true)?;
        let prompt = self.tok.encode_raw(&rendered)?;
        let mut session = match Session::resume(self.model, &prompt, &self.opts, self.prefix.take())
        {
            Ok(s) => s,
            Err(e) => {
                self.messages.pop();
                return Err(with_flags(e));
            }
        };
        let (answer, stats) = self.generate(&mut session)?;
        self.last = Some(stats);
        self.prefix = Some(session.into_prefix());
        self.messages.push(Message::new("assistant", answer));
        Ok(())
    }

    /// Steps `session` to its end (or Ctrl-C), printing the text as it
    /// comes; the answer's text.
    fn generate(&self, session: &mut Session) -> Result<(String, TurnStats)> {
        let engine = Engine::new(self.model);
        let mut prof = Profile::default();
        let mut stream = TextStream::new(&self.tok);
        let mut answer = String::new();
        let mut stdout = std::io::stdout();
        let before = self.model.store.counters();
        let start = Instant::now();
        STOP.store(false, Ordering::SeqCst);
        GENERATING.store(true, Ordering::SeqCst);
        while !session.is_done() && !STOP.load(Ordering::SeqCst) {
            let step = engine.step(&mut [&mut *session], &mut prof);
            let produced = match step {
                Ok(p) => p,
                Err(e) => {
                    GENERATING.store(false, Ordering::SeqCst);
                    return Err(with_flags(e));
                }
            };
            let n = session.tokens().len();
            for i in n - produced[0]..n {
                let piece = stream.push(session.tokens()[i])?;
                answer.push_str(&piece);
                let _ = stdout.write_all(piece.as_bytes());
            }
            let _ = stdout.flush();
        }
        GENERATING.store(false, Ordering::SeqCst);
        let stopped = STOP.swap(false, Ordering::SeqCst);
        println!("{}", if stopped { " [stopped]" } else { "" });
        let after = self.model.store.counters();
        let stats = TurnStats {
            prompt: session.prompt().len(),
            reused: session.reused(),
            tokens: session.tokens().len(),
            seconds: start.elapsed().as_secs_f64(),
            hits: (after.hits + after.pinned_hits) - (before.hits + before.pinned_hits),
            misses: after.misses - before.misses,
            stopped,
        };
        Ok((answer, stats))
    }

    fn print_stats(&self) {
        let Some(s) = &self.last else {
            eprintln!("[stats] no answer yet");
            return;
        };
        let lookups = (s.hits + s.misses).max(1);
        eprintln!(
            "[stats] last answer: {} tokens in {:.2} s ({:.2} tok/s){} | prompt {} tokens, {} reused from the conversation's KV, {} prefilled | expert hit rate {:.1}% | conversation: {} messages",
            s.tokens,
            s.seconds,
            s.tokens as f64 / s.seconds.max(1e-9),
            if s.stopped { ", stopped" } else { "" },
            s.prompt,
            s.reused,
            s.prompt - s.reused,
            100.0 * s.hits as f64 / lookups as f64,
            self.messages.len(),
        );
    }
}
