//! A chat answer's text split into what OpenAI's clients read apart:
//! `reasoning_content` (a thinking model's `<think>` part, unless
//! `--reasoning-format none`), `content`, and `tool_calls` (when the
//! request offered tools), whole or piece by piece as tokens stream.
//!
//! Streamed pieces add up to the whole split: reasoning goes out as it
//! comes (a possible `</think>` held back), content as it comes until a
//! tool call may be opening (then held, and parsed at the end).

use super::tools::{ToolPlan, ToolStream};
use crate::formats::chat::reasoning::ReasoningStream;
use crate::formats::chat::tool_calls::ToolCall;

/// The pieces of a streamed answer that can go out now.
#[derive(Debug, Default, PartialEq)]
pub struct Pieces {
    pub reasoning: String,
    pub content: String,
}

/// The end of an answer: the last pieces and the calls.
#[derive(Debug, Default, PartialEq)]
pub struct Ending {
    pub pieces: Pieces,
    pub calls: Vec<ToolCall>,
}

/// Splits one answer.
#[derive(Debug)]
pub struct Splitter<'p> {
    reasoning: Option<ReasoningStream>,
    tools: Option<(&'p ToolPlan, ToolStream)>,
    /// Content bytes sent (without tools).
    content_sent: usize,
}

impl<'p> Splitter<'p> {
    /// `reasoning`: Some(whether the output starts inside it) to split
    /// reasoning out; `tools`: the request's tool plan.
    pub fn new(reasoning: Option<bool>, tools: Option<&'p ToolPlan>) -> Splitter<'p> {
        Splitter {
            reasoning: reasoning.map(ReasoningStream::new),
            tools: tools.map(|t| (t, ToolStream::new(t.format))),
            content_sent: 0,
        }
    }

    /// Takes the answer's text that may be sent so far; the new pieces.
    pub fn push(&mut self, text: &str) -> Pieces {
        let (reasoning, from) = match &mut self.reasoning {
            Some(r) => (r.push(text).to_string(), r.content_from()),
            None => (String::new(), Some(0)),
        };
        let content = match from {
            Some(from) => self.content(&text[from..]),
            None => String::new(),
        };
        Pieces { reasoning, content }
    }

    /// The content of `content` (the answer's content so far) to send now.
    fn content(&mut self, content: &str) -> String {
        match &mut self.tools {
            Some((_, t)) => t.content(content).to_string(),
            None => {
                let out = content[self.content_sent..].to_string();
                self.content_sent = content.len();
                out
            }
        }
    }

    /// Takes the whole answer at its end: what was not sent yet, and the
    /// calls parsed out of the content.
    pub fn finish(&mut self, text: &str) -> Ending {
        let (reasoning, from) = match &mut self.reasoning {
            Some(r) => {
                let (rest, from) = r.finish(text);
                (rest.to_string(), from)
            }
            None => (String::new(), 0),
        };
        let content = &text[from..];
        let (content, calls) = match &mut self.tools {
            Some((plan, t)) => {
                let parsed = plan.format.parse(content, &plan.tools);
                (t.finish(&parsed, content), parsed.calls)
            }
            None => (content[self.content_sent..].to_string(), Vec::new()),
        };
        self.content_sent = text.len();
        Ending {
            pieces: Pieces { reasoning, content },
            calls,
        }
    }

    /// The whole split of a finished answer.
    pub fn whole(reasoning: Option<bool>, tools: Option<&'p ToolPlan>, text: &str) -> Ending {
        let mut s = Splitter::new(reasoning, tools);
        let mut end = s.finish(text);
        if !end.calls.is_empty() {
            end.pieces.content = end.pieces.content.trim_end().to_string();
        }
        end
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::chat::tool_calls::{Tool, ToolFormat};

    fn plan() -> ToolPlan {
        ToolPlan {
            after_marker: None,
            format: ToolFormat::Hermes,
            tools: vec![Tool {
                name: "f".into(),
                parameters: serde_json::json!({"type": "object"}),
            }],
            shown: serde_json::Value::Null,
            grammar: None,
        }
    }

    /// Streams `text` a character at a time; the pieces gathered and the
    /// calls.
    fn streamed(reasoning: Option<bool>, tools: Option<&ToolPlan>, text: &str) -> Ending {
        let mut s = Splitter::new(reasoning, tools);
        let mut all = Pieces::default();
        for end in (1..=text.len()).filter(|&e| text.is_char_boundary(e)) {
            let p = s.push(&text[..end]);
            all.reasoning.push_str(&p.reasoning);
            all.content.push_str(&p.content);
        }
        let end = s.finish(text);
        all.reasoning.push_str(&end.pieces.reasoning);
        all.content.push_str(&end.pieces.content);
        Ending {
            pieces: all,
            calls: end.calls,
        }
    }

    #[test]
    fn streamed_splits_equal_whole_ones() {
        let plan = plan();
        let cases: [(Option<bool>, Option<&ToolPlan>, &str); 5] = [
            (Some(false), None, "<think>hm</think>\n\nYes."),
            (
                Some(true),
                Some(&plan),
                "hm</think>Ok. <tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
            ),
            (
                None,
                Some(&plan),
                "<think>x</think> <tool_call>{\"name\": \"f\"}</tool_call>",
            ),
            (Some(false), Some(&plan), "plain text <tool_call> broken"),
            (None, None, "<think>kept</think>"),
        ];
        for (r, t, text) in cases {
            let whole = Splitter::whole(r, t, text);
            let mut got = streamed(r, t, text);
            if !got.calls.is_empty() {
                got.pieces.content = got.pieces.content.trim_end().to_string();
            }
            assert_eq!(got, whole, "{text:?}");
        }
        let w = Splitter::whole(Some(true), Some(&plan), cases[1].2);
        assert_eq!(w.pieces.reasoning, "hm");
        assert_eq!(w.pieces.content, "Ok.");
        assert_eq!(w.calls.len(), 1);
        let w = Splitter::whole(None, None, "<think>kept</think>");
        assert_eq!(w.pieces.content, "<think>kept</think>");
    }
}
