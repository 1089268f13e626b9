//! A thinking model's reasoning split from its answer, as llama-server's
//! `--reasoning-format deepseek` and vLLM's reasoning parsers split it:
//! the text inside `<think>…</think>` is `reasoning_content`, the rest
//! `content`.
//!
//! Where the reasoning starts: at a `<think>` the model writes, or at the
//! start of the output when the prompt already opened it (templates that
//! end the generation prompt with `<think>`, as DeepSeek-R1's and
//! Qwen3-Thinking's do). A prompt that closed it (`<think></think>`,
//! thinking switched off) starts in the answer. Reasoning that never
//! closes (the budget ran out) is all reasoning.

/// Opens the reasoning.
pub const THINK_OPEN: &str = "<think>";
/// Closes it.
pub const THINK_CLOSE: &str = "</think>";

/// Whether a template writes reasoning (it prints `</think>`).
pub fn is_thinking_template(source: &str) -> bool {
    source.contains(THINK_CLOSE)
}

/// Whether the output of `prompt` starts inside the reasoning: the
/// prompt's last tag is an open `<think>`.
pub fn starts_in_reasoning(prompt: &str) -> bool {
    match (prompt.rfind(THINK_OPEN), prompt.rfind(THINK_CLOSE)) {
        (Some(open), Some(close)) => open > close && prompt[open..].trim_end() == THINK_OPEN,
        (Some(open), None) => prompt[open..].trim_end() == THINK_OPEN,
        _ => false,
    }
}

/// `text` split into (reasoning, content); `in_reasoning` when the output
/// starts inside it. Whitespace between the close tag and the answer is
/// dropped, as the parsers drop it.
pub fn split(text: &str, in_reasoning: bool) -> (String, String) {
    let (r, c) = split_at(text, in_reasoning);
    (r.to_string(), c.trim_start().to_string())
}

/// The reasoning part and the content part of `text` (borrowed), the
/// content still with its leading whitespace.
fn split_at(text: &str, in_reasoning: bool) -> (&str, &str) {
    let body = if in_reasoning {
        text
    } else {
        match text.trim_start().strip_prefix(THINK_OPEN) {
            Some(rest) => rest,
            None => return (&text[..0], text),
        }
    };
    match body.find(THINK_CLOSE) {
        Some(end) => (&body[..end], &body[end + THINK_CLOSE.len()..]),
        None => (body, ""),
    }
}

/// A streamed output's split: how much of the text so far can go out as
/// reasoning, and where the content starts once the reasoning closed.
#[derive(Debug)]
pub struct ReasoningStream {
    in_reasoning: bool,
    /// Bytes of the text sent as reasoning (or skipped: the open tag).
    sent: usize,
    /// Where the content starts, once known.
    content_from: Option<usize>,
}

impl ReasoningStream {
    pub fn new(in_reasoning: bool) -> ReasoningStream {
        ReasoningStream {
            in_reasoning,
            sent: 0,
            content_from: None,
        }
    }

    /// Takes the text so far; returns the reasoning that can be sent now.
    /// Text that may be the start of a tag is held back.
    pub fn push<'t>(&mut self, text: &'t str) -> &'t str {
        if self.content_from.is_some() {
            return "";
        }
        if !self.in_reasoning {
            let lead = text.len() - text.trim_start().len();
            let rest = &text[lead..];
            if rest.starts_with(THINK_OPEN) {
                self.in_reasoning = true;
                self.sent = lead + THINK_OPEN.len();
            } else if THINK_OPEN.starts_with(rest) {
                return ""; // may still become `<think>`
            } else {
                self.content_from = Some(0);
                return "";
            }
        }
        let body = &text[self.sent..];
        if let Some(end) = body.find(THINK_CLOSE) {
            let close = self.sent + end;
            let out = &text[self.sent..close];
            let after = close + THINK_CLOSE.len();
            let lead = text[after..].len() - text[after..].trim_start().len();
            // Whitespace after the close tag may be followed by more; the
            // content starts at the first other character.
            if after + lead < text.len() {
                self.content_from = Some(after + lead);
            }
            self.sent = close;
            return out;
        }
        let held = super::tool_calls::hold_from(body, THINK_CLOSE).unwrap_or(body.len());
        let out = &body[..held];
        self.sent += held;
        out
    }

    /// Where the content starts in the text, once the reasoning is over
    /// (or never began).
    pub fn content_from(&self) -> Option<usize> {
        self.content_from
    }

    /// At the end of the output: the reasoning not sent yet, and where the
    /// content starts (the end of the text when there is none).
    pub fn finish<'t>(&mut self, text: &'t str) -> (&'t str, usize) {
        if let Some(from) = self.content_from {
            return ("", from);
        }
        let (reasoning, content) = split_at(text, self.in_reasoning);
        let content_from = text.len() - content.trim_start().len();
        self.content_from = Some(content_from);
        let start = offset_in(text, reasoning);
        let end = start + reasoning.len();
        (&text[self.sent.clamp(start, end)..end], content_from)
    }
}

/// The byte offset of `part` (a slice of `text`) in `text`.
fn offset_in(text: &str, part: &str) -> usize {
    part.as_ptr() as usize - text.as_ptr() as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_outputs_split() {
        let cases = [
            ("<think>a b</think>\n\nAnswer.", false, "a b", "Answer."),
            ("a b</think>Answer.", true, "a b", "Answer."),
            ("Just an answer.", false, "", "Just an answer."),
            ("<think>never closed", false, "never closed", ""),
            ("still thinking", true, "still thinking", ""),
            ("\n<think>x</think>", false, "x", ""),
        ];
        for (text, in_r, r, c) in cases {
            assert_eq!(
                split(text, in_r),
                (r.to_string(), c.to_string()),
                "{text:?}"
            );
        }
    }

    #[test]
    fn prompts_that_open_the_reasoning_are_seen() {
        assert!(starts_in_reasoning("<|im_start|>assistant\n<think>\n"));
        assert!(!starts_in_reasoning(
            "<|im_start|>assistant\n<think>\n\n</think>\n\n"
        ));
        assert!(!starts_in_reasoning(
            "<think>x</think> <|im_start|>assistant\n"
        ));
        assert!(!starts_in_reasoning("<|im_start|>assistant\n"));
    }

    #[test]
    fn streamed_pieces_add_up_to_the_whole_split() {
        for (text, in_r) in [
            ("<think>a </thi b</think>\n\nAnswer <think>.", false),
            ("r1 style</think>Answer.", true),
            ("plain <think> text", false),
            ("<think>cut off </th", false),
            ("<thi", false),
        ] {
            let mut s = ReasoningStream::new(in_r);
            let mut reasoning = String::new();
            for end in 1..=text.len() {
                if text.is_char_boundary(end) {
                    reasoning.push_str(s.push(&text[..end]));
                }
            }
            let (rest, from) = s.finish(text);
            reasoning.push_str(rest);
            let (r, c) = split(text, in_r);
            assert_eq!(reasoning, r, "{text:?}");
            assert_eq!(&text[from..], c, "{text:?}");
        }
    }
}
