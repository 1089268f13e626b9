//! A chat template: compiled, and rendered over a small conversation with
//! tiny fuel and memory bounds; any error is fine, a panic or an abort is
//! not.
#![no_main]

use libfuzzer_sys::fuzz_target;
use moestream::chat::{ChatTemplate, Message, SpecialTokens};

fuzz_target!(|data: &[u8]| {
    let Ok(source) = std::str::from_utf8(data) else {
        return;
    };
    let tokens = SpecialTokens {
        bos_token: Some("<s>".into()),
        eos_token: Some("</s>".into()),
    };
    let Ok(t) = ChatTemplate::new(source.into(), tokens, "fuzz.jinja".into()) else {
        return;
    };
    let t = t.with_limits(100_000, 1 << 20);
    let messages = [
        Message::new("system", "be brief"),
        Message::new("user", "hi\nthere"),
        Message::new("assistant", "hello"),
    ];
    let _ = t.render(&messages, true);
});
