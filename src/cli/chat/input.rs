//! Where `chat` reads its messages: a terminal, with line editing and
//! this session's history (rustyline; nothing is written to disk), or a
//! pipe, line by line. Either way a line that is not UTF-8 is reported as
//! such, never an error that ends the program; a message is one line,
//! lines joined by a trailing `\`, or the lines between two `"""` lines.

use anyhow::Result;
use std::io::{BufRead, IsTerminal};

/// One line of input.
pub enum Line {
    Text(String),
    /// The line's bytes are not UTF-8 (it is skipped).
    NotUtf8,
    /// End of input (Ctrl-D; Ctrl-C at a terminal's prompt).
    End,
}

/// One message of input.
pub enum Input {
    Message(String),
    /// A line of the message was not UTF-8: the whole message is skipped.
    NotUtf8,
    End,
}

/// A source of lines.
pub trait Source {
    /// The next line, after showing `prompt` (without its newline).
    fn line(&mut self, prompt: &str) -> Result<Line>;
}

/// The terminal when stdin is one, else stdin as a pipe.
pub fn stdin() -> Result<Box<dyn Source>> {
    if std::io::stdin().is_terminal() {
        let config = rustyline::Config::builder().auto_add_history(true).build();
        let editor = rustyline::DefaultEditor::with_config(config)
            .map_err(|e| anyhow::anyhow!("opening the terminal for line editing: {e}"))?;
        return Ok(Box::new(Terminal { editor }));
    }
    Ok(Box::new(Piped {
        input: std::io::stdin().lock(),
    }))
}

/// A terminal: line editing, and the history of this session (Up/Down).
struct Terminal {
    editor: rustyline::DefaultEditor,
}

impl Source for Terminal {
    fn line(&mut self, prompt: &str) -> Result<Line> {
        use rustyline::error::ReadlineError;
        match self.editor.readline(prompt) {
            Ok(text) => Ok(Line::Text(text)),
            Err(ReadlineError::Eof | ReadlineError::Interrupted) => Ok(Line::End),
            Err(ReadlineError::Io(e)) if e.kind() == std::io::ErrorKind::InvalidData => {
                Ok(Line::NotUtf8)
            }
            Err(ReadlineError::WindowResized) => Ok(Line::Text(String::new())),
            Err(e) => Err(anyhow::anyhow!("reading the terminal: {e}")),
        }
    }
}

/// Lines of a pipe (or a file), the prompt on stderr.
pub struct Piped<R: BufRead> {
    pub input: R,
}

impl<R: BufRead> Source for Piped<R> {
    fn line(&mut self, prompt: &str) -> Result<Line> {
        if !prompt.is_empty() {
            eprint!("{prompt}");
        }
        let mut bytes = Vec::new();
        if self.input.read_until(b'\n', &mut bytes)? == 0 {
            return Ok(Line::End);
        }
        if bytes.last() == Some(&b'\n') {
            bytes.pop();
            if bytes.last() == Some(&b'\r') {
                bytes.pop();
            }
        }
        Ok(String::from_utf8(bytes).map_or(Line::NotUtf8, Line::Text))
    }
}

/// The fence that opens and closes a block of lines.
const FENCE: &str = "\"\"\"";

/// Reads one message.
pub fn read_message(src: &mut dyn Source) -> Result<Input> {
    let first = match src.line("> ")? {
        Line::Text(t) => t,
        Line::NotUtf8 => return Ok(Input::NotUtf8),
        Line::End => return Ok(Input::End),
    };
    let (mut text, mut valid) = (String::new(), true);
    if first.trim_end() == FENCE {
        loop {
            match src.line("... ")? {
                Line::Text(l) if l.trim_end() == FENCE => break,
                Line::Text(l) => {
                    text.push_str(&l);
                    text.push('\n');
                }
                Line::NotUtf8 => valid = false,
                Line::End => break,
            }
        }
        let text = text.trim_end_matches('\n').to_string();
        return Ok(if valid {
            Input::Message(text)
        } else {
            Input::NotUtf8
        });
    }
    let mut line = first;
    loop {
        match line.strip_suffix('\\') {
            Some(head) => {
                text.push_str(head);
                text.push('\n');
            }
            None => {
                text.push_str(&line);
                break;
            }
        }
        line = match src.line("... ")? {
            Line::Text(l) => l,
            Line::NotUtf8 => {
                valid = false;
                String::new()
            }
            Line::End => break,
        };
    }
    Ok(if valid {
        Input::Message(text)
    } else {
        Input::NotUtf8
    })
}

/// What a message asks of `chat`.
#[derive(Debug, PartialEq, Eq)]
pub enum Command<'a> {
    Exit,
    Reset,
    Stats,
    Help,
    /// A `/word` this program does not know (never sent to the model).
    Unknown(&'a str),
    /// Text for the model (`//...` sends `/...`).
    Say(&'a str),
    Nothing,
}

/// The command `text` is, if any.
pub fn command(text: &str) -> Command<'_> {
    let t = text.trim();
    match t {
        "" => Command::Nothing,
        "exit" | "quit" | "/exit" | "/quit" | "/bye" => Command::Exit,
        "/reset" | "/clear" => Command::Reset,
        "/stats" => Command::Stats,
        "/help" | "/?" => Command::Help,
        _ if t.starts_with("//") => Command::Say(&text[text.find('/').map_or(0, |i| i + 1)..]),
        _ if t.starts_with('/') => Command::Unknown(t.split_whitespace().next().unwrap_or(t)),
        _ => Command::Say(text),
    }
}

/// What `/help` prints.
pub const HELP: &str = "\
/help        this list
/reset       start the conversation over (also /clear)
/stats       the last answer's figures
/exit        end (also /quit, /bye, exit, quit, Ctrl-D)
//text       send text that starts with /
a line ending in \\ continues on the next; lines between two \"\"\" lines are one message
Ctrl-C stops an answer being generated";

#[cfg(test)]
mod tests {
    use super::*;

    fn messages(bytes: &[u8]) -> Vec<Option<String>> {
        let mut src = Piped { input: bytes };
        let mut out = Vec::new();
        loop {
            match read_message(&mut src).unwrap() {
                Input::Message(m) => out.push(Some(m)),
                Input::NotUtf8 => out.push(None),
                Input::End => return out,
            }
        }
    }

    #[test]
    fn lines_blocks_continuations_and_bad_bytes() {
        let got = messages(
            b"one\r\ntwo \\\nthree\n\"\"\"\na\n\xff\n\"\"\"\nbad \xfe\n\"\"\"\nx\ny\n\"\"\"\nlast",
        );
        let want = [
            Some("one"),
            Some("two \nthree"),
            None,
            None,
            Some("x\ny"),
            Some("last"),
        ];
        assert_eq!(got, want.map(|w| w.map(String::from)));
    }

    #[test]
    fn commands_are_never_text() {
        assert_eq!(command("  exit "), Command::Exit);
        assert_eq!(command("/bye"), Command::Exit);
        assert_eq!(command("/help"), Command::Help);
        assert_eq!(command("/reset"), Command::Reset);
        assert_eq!(command("/frobnicate now"), Command::Unknown("/frobnicate"));
        assert_eq!(command("//etc/hosts?"), Command::Say("/etc/hosts?"));
        assert_eq!(command("exit the loop"), Command::Say("exit the loop"));
        assert_eq!(command("   "), Command::Nothing);
    }
}
