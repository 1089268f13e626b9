//! Stop sequences over streamed text: how much of the text so far can be
//! sent, and where a stop sequence ends the answer. Text that might be the
//! start of a stop sequence is held back until the next token decides.

/// What to do with the text generated so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scan {
    /// Send up to this byte offset; hold the rest back.
    SendUpTo(usize),
    /// A stop sequence starts at this byte offset: send up to it, end.
    StopAt(usize),
}

/// Scans `text` for the earliest of `stops` (empty strings ignored).
/// Without a match, everything may be sent except the longest tail that is
/// a proper prefix of some stop sequence (it may complete next token).
pub fn scan(text: &str, stops: &[String]) -> Scan {
    let earliest = stops
        .iter()
        .filter(|s| !s.is_empty())
        .filter_map(|s| text.find(s.as_str()))
        .min();
    if let Some(at) = earliest {
        return Scan::StopAt(at);
    }
    let held = stops.iter().map(|s| held_tail(text, s)).max().unwrap_or(0);
    Scan::SendUpTo(text.len() - held)
}

/// Length of the longest tail of `text` that is a proper prefix of `stop`,
/// ending on a char boundary.
fn held_tail(text: &str, stop: &str) -> usize {
    (1..stop.len().min(text.len() + 1))
        .rev()
        .find(|&n| {
            let start = text.len() - n;
            text.is_char_boundary(start) && stop.starts_with(&text[start..])
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let cases: &[(&str, &[&str], Scan)] = &[
            ("hello", &[], Scan::SendUpTo(5)),
            ("hello", &["xyz"], Scan::SendUpTo(5)),
            ("hello wo", &["world"], Scan::SendUpTo(6)),
            ("hello world!", &["world"], Scan::StopAt(6)),
            ("a\n\nb", &["\n\n", "b"], Scan::StopAt(1)),
            ("abc", &["", "c"], Scan::StopAt(2)),
            ("ab", &["abc", "bz"], Scan::SendUpTo(0)),
            ("héllo é", &["éa"], Scan::SendUpTo(7)),
            ("x", &["x"], Scan::StopAt(0)),
        ];
        for (text, stops, want) in cases {
            assert_eq!(scan(text, &s(stops)), *want, "{text:?} {stops:?}");
        }
    }
}
