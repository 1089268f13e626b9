//! `moestream chat`: a conversation in the terminal. Each answer streams
//! as it is generated; the conversation's KV stays between turns (a turn
//! prefills only what the template added since the last one). Multi-line
//! input: end a line with `\` to continue it, or enclose lines in `"""`.
//! Commands (never sent to the model): /help, /reset, /stats, /exit
//! (`exit`, `quit`, /quit, /bye); an unknown `/word` is said so. Ctrl-C
//! stops the answer being generated; at the prompt it ends the program
//! (as does Ctrl-D). On a terminal lines can be edited and this session's
//! history recalled ([`input`]); piped input is read line by line.
//!
//! The conversation survives what would end it: a turn whose prompt and
//! answer would pass the context drops the oldest turns (saying so), a
//! message that alone passes it is refused with the numbers, a line that
//! is not UTF-8 is skipped with a notice, a failed turn is reported and
//! left out of the conversation.

mod input;

use super::serve::chat_template_required;
use super::*;
use moestream::engine::{Engine, Prefix, Session};
use moestream::formats::chat::{ChatTemplate, Message};
use moestream::model::profile::Profile;
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
        sampling: a.sampling.sampling(&defaults),
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
    eprintln!("chat with {} (/help, /reset, /stats, /exit; end a line with \\ or enclose lines in \"\"\" for more lines)", dir.display());
    let mut source = input::stdin()?;
    loop {
        let text = match input::read_message(source.as_mut())? {
            input::Input::Message(t) => t,
            input::Input::NotUtf8 => {
                eprintln!("[that input is not valid UTF-8: skipped]");
                continue;
            }
            input::Input::End => break,
        };
        match input::command(&text) {
            input::Command::Nothing => {}
            input::Command::Exit => break,
            input::Command::Reset => {
                chat.reset();
                eprintln!("[conversation cleared]");
            }
            input::Command::Stats => chat.print_stats(),
            input::Command::Help => eprintln!("{}", input::HELP),
            input::Command::Unknown(c) => eprintln!(
                "[unknown command {c}: /help lists them; //text sends text starting with /]"
            ),
            input::Command::Say(t) => {
                let kept = chat.messages.len();
                if let Err(e) = chat.turn(t) {
                    chat.messages.truncate(kept);
                    eprintln!("error: {e:#} (the message is not part of the conversation)");
                }
            }
        }
    }
    Ok(())
}

impl Chat<'_> {
    fn reset(&mut self) {
        self.messages.clear();
        if let Some(s) = &self.system {
            self.messages.push(Message::new("system", s.clone()));
        }
    }

    /// The KV positions one turn may use: the context, within what the
    /// RAM plan reserved.
    fn positions_max(&self) -> usize {
        let context = self.model.cfg.rope.max_position_embeddings;
        context.min(self.model.context_budget.unwrap_or(context))
    }

    /// Removes the oldest user turn of `messages` and what answered it
    /// (never the system message nor the last user message); the
    /// messages removed.
    fn drop_oldest_turn(&self, messages: &mut Vec<Message>) -> usize {
        let first = usize::from(self.system.is_some()).min(messages.len());
        let next_user = messages
            .iter()
            .skip(first + 1)
            .position(|m| m.role == "user")
            .map(|i| first + 1 + i);
        match next_user {
            Some(end) => {
                messages.drain(first..end);
                end - first
            }
            None => 0,
        }
    }

    /// The prompt of the conversation with its last user message, and the
    /// options it runs with: the oldest turns dropped until the prompt and
    /// the answer fit the context (the answer shortened when the prompt
    /// alone leaves less room); None, the conversation as it was, when the
    /// message alone does not fit.
    fn fitted_prompt(&mut self) -> Result<Option<(Vec<u32>, GenOptions)>> {
        let limit = self.positions_max();
        let mut messages = self.messages.clone();
        let mut dropped = 0;
        let prompt = loop {
            let rendered = self.template.render(&messages, true)?;
            let prompt = self.tok.encode_raw(&rendered)?;
            if prompt.len() + self.opts.max_tokens <= limit {
                break prompt;
            }
            match self.drop_oldest_turn(&mut messages) {
                0 => break prompt,
                n => dropped += n,
            }
        };
        if prompt.len() >= limit {
            eprintln!(
                "[this message makes a prompt of {} tokens; the context holds {limit}: not sent (/reset starts over)]",
                prompt.len()
            );
            return Ok(None);
        }
        if dropped > 0 {
            eprintln!(
                "[the conversation outgrew the context of {limit} tokens: dropped the oldest {dropped} messages; {} remain]",
                messages.len()
            );
        }
        self.messages = messages;
        let mut opts = self.opts.clone();
        opts.max_tokens = opts.max_tokens.min(limit - prompt.len());
        Ok(Some((prompt, opts)))
    }

    /// One user message and the streamed answer.
    fn turn(&mut self, text: &str) -> Result<()> {
        self.messages.push(Message::new("user", text));
        let Some((prompt, opts)) = self.fitted_prompt()? else {
            self.messages.pop();
            return Ok(());
        };
        let mut session = match Session::resume(self.model, &prompt, &opts, self.prefix.take()) {
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
