//! Tests of the GBNF translation: exact Lark output for small grammars,
//! llama.cpp's example grammars compiled and run through llguidance (one
//! byte per token, every byte checked against the mask), strings drawn
//! from each grammar accepted, the cases a greedy lexer gets wrong,
//! random grammars against a reference recognizer, and errors that name
//! their line and column.

use super::ast::{Expr, Grammar};
use super::charset::CharSet;
use super::parse::parse;
use super::*;
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::ApproximateTokEnv;
use llguidance::{Matcher, ParserFactory};

// llama.cpp's grammars/ examples (MIT license), verbatim.
const ARITHMETIC: &str = r#"root  ::= (expr "=" ws term "\n")+
expr  ::= term ([-+*/] term)*
term  ::= ident | num | "(" ws expr ")" ws
ident ::= [a-z] [a-z0-9_]* ws
num   ::= [0-9]+ ws
ws    ::= [ \t\n]*
"#;

const LIST: &str = r#"root ::= item+

# Excludes various line break characters
item ::= "- " [^\r\n\x0b\x0c\x85\u2028\u2029]+ "\n"
"#;

const CHESS: &str = r#"# Specifies chess moves as a list in algebraic notation, using PGN conventions

# Force first move to "1. ", then any 1-2 digit number after, relying on model to follow the pattern
root    ::= "1. " move " " move "\n" ([1-9] [0-9]? ". " move " " move "\n")+
move    ::= (pawn | nonpawn | castle) [+#]?

# piece type, optional file/rank, optional capture, dest file & rank
nonpawn ::= [NBKQR] [a-h]? [1-8]? "x"? [a-h] [1-8]

# optional file & capture, dest file & rank, optional promotion
pawn    ::= ([a-h] "x")? [a-h] [1-8] ("=" [NBKQR])?

castle  ::= "O-O" "-O"?
"#;

const JSON: &str = r#"root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
"#;

const ENGLISH: &str = r##"# note: this might be incomplete, mostly an example
root        ::= en-char+ ([ \t\n] en-char+)*
en-char     ::= letter | digit | punctuation
letter      ::= [a-zA-Z]
digit       ::= [0-9]
punctuation ::= [!"#$%&'()*+,-./:;<=>?@[\\\]^_`{|}~]
"##;

const JAPANESE: &str = r#"# A probably incorrect grammar for Japanese
root        ::= jp-char+ ([ \t\n] jp-char+)*
jp-char     ::= hiragana | katakana | punctuation | cjk
hiragana    ::= [ぁ-ゟ]
katakana    ::= [ァ-ヿ]
punctuation ::= [、-〾]
cjk         ::= [一-鿿]
"#;

/// A llguidance matcher of `lark` over a one-byte-per-token vocabulary.
fn matcher(lark: &str) -> Matcher {
    let env = ApproximateTokEnv::single_byte_env();
    let mut factory = ParserFactory::new_simple(&env).unwrap();
    factory.quiet();
    let m = Matcher::new(factory.create_parser(TopLevelGrammar::from_lark(lark.to_string())));
    if let Some(e) = m.get_error() {
        panic!("llguidance refuses the translation: {e}\n{lark}");
    }
    m
}

/// Whether `lark` accepts exactly `text`: every byte allowed by the mask
/// before it, then end-of-sequence allowed.
fn accepts(lark: &str, text: &str) -> bool {
    let mut m = matcher(lark);
    let eos = m.tok_env().unwrap().tok_trie().eos_token();
    for b in text.bytes() {
        let mask = m
            .compute_mask_or_eos()
            .unwrap_or_else(|e| panic!("mask before {text:?}: {e}"));
        if !mask.is_allowed(b as u32) {
            return false;
        }
        m.consume_token(b as u32).unwrap();
    }
    m.compute_mask_or_eos().unwrap().is_allowed(eos)
}

fn lark(gbnf: &str) -> String {
    to_lark(gbnf).unwrap_or_else(|e| panic!("{e}\n{gbnf}"))
}

#[test]
fn translations() {
    let cases = [
        ("root ::= \"a\"", "start: root\nroot: \"a\"\n"),
        ("root ::= [a-z]+ \"s\"", "start: root\nroot: ROOT\nROOT: /[a-z]/+ \"s\"\n"),
        (
            "root ::= x\nx ::= \"(\" x* \")\"",
            "start: root\nroot: x\nx: \"(\" x* \")\"\n",
        ),
        (
            "root ::= item{2,3}\nitem ::= \"<\" root? \">\" | [^<>]",
            "start: root\nroot: item{2,3}\nitem: \"<\" root? \">\" | /[^\\x{3c}\\x{3e}]/\n",
        ),
        (
            "root ::= dataType\ndataType ::= \"a\\tb\\\"\" . [\\x00-\\x1f] {2,}",
            "start: root\nroot: X_DATA_TYPE\nX_DATA_TYPE: \"a\\tb\\\"\" /(?s:.)/ /[\\x{0}-\\x{1f}]/{2,}\n",
        ),
        ("root ::= ", "start: root\nroot: \"\"\n"),
        (
            "root ::= start\nstart ::= \"é\"{3}",
            "start: root\nroot: X_START\nX_START: \"é\"{3}\n",
        ),
    ];
    for (gbnf, want) in cases {
        assert_eq!(lark(gbnf), want, "{gbnf}");
        matcher(want);
    }
}

#[test]
fn a_lexeme_that_could_swallow_what_follows_is_split() {
    // `word` alone would be `[a-z]+ " "?`; followed by a letter it could
    // run on into the next word, so it is split into its pieces.
    let g = "root ::= list\nlist ::= \"(\" (word | list)* \")\"\nword ::= [a-z]+ \" \"?";
    let out = lark(g);
    assert!(out.contains("word: /[a-z]/+ \" \"?\n"), "{out}");
    for text in ["(ab c(d))", "(abc)", "(a b c )", "()", "((x)y)"] {
        assert!(accepts(&out, text), "{text:?}\n{out}");
    }
    for text in ["(ab", "(A)", "( )"] {
        assert!(!accepts(&out, text), "{text:?}\n{out}");
    }
}

#[test]
fn greedy_traps_keep_every_parse() {
    let cases: [(&str, &[&str], &[&str]); 4] = [
        // "a" then "bc", or "ab" then "d": a greedy "ab" loses "abc".
        (
            "root ::= r\nr ::= (\"a\" \"bc\" | \"ab\" \"d\") (\"(\" r \")\")?",
            &["abc", "abd", "abc(abd)"],
            &["ab", "abcd"],
        ),
        // The last `ws` and the final newline both want "\n".
        (
            ARITHMETIC,
            &["a=b\n", "x = (y+1)\n", "a=b\n\nc=d\n"],
            &["a=b", "=b\n"],
        ),
        // After "a", a lexer that saw the byte 0xC3 of "é" could have
        // continued "aè" (0xC3 0xA8): same first byte.
        (
            "root ::= r\nr ::= \"a\" s | \"aè\"\ns ::= \"é\" r?",
            &["aé", "aè", "aéaè"],
            &["a", "aéa"],
        ),
        // The repetition count bounds the words, not the letters.
        (
            "root ::= (w \" \"?){2}\nw ::= [a-z]+ | \"<\" root \">\"",
            &["ab", "a b", "<a b>c"],
            &["a", "a b c"],
        ),
    ];
    for (gbnf, good, bad) in cases {
        let out = lark(gbnf);
        for text in good {
            assert!(accepts(&out, text), "{text:?} refused\n{gbnf}\n{out}");
        }
        for text in bad {
            assert!(!accepts(&out, text), "{text:?} accepted\n{gbnf}\n{out}");
        }
    }
}

#[test]
fn llama_cpp_examples_accept_and_refuse() {
    let cases: [(&str, &[&str], &[&str]); 6] = [
        (
            ARITHMETIC,
            &["x=1\n", "a1 +b_2 = (c*3)\n"],
            &["x=\n", "X=1\n"],
        ),
        (
            LIST,
            &["- milk\n- eggs\n"],
            &["- milk", "-milk\n", "- a\u{2028}b\n"],
        ),
        (
            CHESS,
            &["1. e4 e5\n2. Nf3 Nc6\n", "1. O-O O-O-O\n2. exd5 Qxd8+\n"],
            &["1. e4 e5\n", "1. e9 e5\n2. a3 a4\n"],
        ),
        (
            JSON,
            &[
                "{}",
                "{\"a\": [1, 2.5e3, true, null, \"x\\n\"]}\n",
                "{\"k\":{\"n\":-0}}",
            ],
            &["[]", "{\"a\":}", "{\"a\": 01}"],
        ),
        (
            ENGLISH,
            &["Hello, world! (1+1=2)", "a\tb\nc"],
            &["", "two  spaces"],
        ),
        (
            JAPANESE,
            &["こんにちは、世界", "カタカナ ひらがな"],
            &["abc", "こ  ん"],
        ),
    ];
    for (gbnf, good, bad) in cases {
        let out = lark(gbnf);
        for text in good {
            assert!(accepts(&out, text), "{text:?} refused\n{out}");
        }
        for text in bad {
            assert!(!accepts(&out, text), "{text:?} accepted\n{out}");
        }
    }
}

/// The fallback when the analysis runs out of budget (every lexeme one
/// code point) is exact too.
#[test]
fn the_one_code_point_fallback_is_exact() {
    let out = {
        let g = parse(ARITHMETIC).unwrap();
        super::emit::lark(&g, &super::lexemes::atomic_plan(&g))
    };
    assert!(
        out.contains("ident: /[a-z]/ /[0-9\\x{5f}a-z]/* ws\n"),
        "{out}"
    );
    for text in ["a=b\n", "x = (y+1)\n", "a1 +b_2 = (c*3)\n"] {
        assert!(accepts(&out, text), "{text:?}\n{out}");
    }
    for text in ["a=b", "X=1\n"] {
        assert!(!accepts(&out, text), "{text:?}\n{out}");
    }
}

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n.max(1)
    }
}

/// Appends a random string of `e` to `out`; `None` when `fuel` runs out.
fn derive(g: &Grammar, e: &Expr, rng: &mut Rng, fuel: &mut u32, out: &mut String) -> Option<()> {
    *fuel = fuel.checked_sub(1)?;
    match e {
        Expr::Empty => {}
        Expr::Literal(s) => out.push_str(s),
        Expr::Class { negated, set } => out.push(pick(&Expr::class_chars(*negated, set), rng)),
        Expr::Ref(r) => derive(g, &g.rules[*r].body, rng, fuel, out)?,
        Expr::Seq(items) => {
            for item in items {
                derive(g, item, rng, fuel, out)?;
            }
        }
        Expr::Alt(alts) => derive(
            g,
            &alts[rng.below(alts.len() as u64) as usize],
            rng,
            fuel,
            out,
        )?,
        Expr::Repeat { item, min, max } => {
            let extra = max.map_or(3, |m| (m - min).min(3));
            for _ in 0..min + rng.below(u64::from(extra) + 1) as u32 {
                derive(g, item, rng, fuel, out)?;
            }
        }
    }
    Some(())
}

/// A random code point of `set`, mostly from its first 128 code points.
fn pick(set: &CharSet, rng: &mut Rng) -> char {
    let ranges = set.ranges();
    let (lo, hi) = ranges[rng.below(ranges.len() as u64) as usize];
    let span = u64::from(hi - lo).min(if rng.below(4) == 0 { u64::MAX - 1 } else { 127 });
    let c = lo + rng.below(span + 1) as u32;
    char::from_u32(c).unwrap_or(char::from_u32(lo).unwrap())
}

/// Strings drawn from the GBNF grammar itself are all accepted by its
/// translation: no parse is lost to greedy lexing.
#[test]
fn every_derived_string_is_accepted() {
    let grammars = [
        ARITHMETIC,
        LIST,
        CHESS,
        JSON,
        ENGLISH,
        JAPANESE,
        "root ::= r\nr ::= (\"a\" \"bc\" | \"ab\" \"d\" | [a-c]+ \"c\") (\"(\" r \")\")?",
        "root ::= t (\",\" t)*\nt ::= [a-z]* \"-\"? [a-z-]* | \"[\" root \"]\"",
    ];
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for gbnf in grammars {
        let g = parse(gbnf).unwrap();
        let out = lark(gbnf);
        let mut drawn = 0;
        while drawn < 40 {
            let (mut text, mut fuel) = (String::new(), 400);
            let root = Expr::Ref(g.root);
            if derive(&g, &root, &mut rng, &mut fuel, &mut text).is_none() {
                continue;
            }
            assert!(accepts(&out, &text), "{text:?} refused\n{gbnf}\n{out}");
            drawn += 1;
        }
    }
}

#[test]
fn errors_name_line_and_column() {
    let cases = [
        ("root \"a\"", 1, 6, "expected `::=` after rule name `root`"),
        (
            "root\n::= \"a\"",
            1,
            5,
            "expected `::=` after rule name `root`",
        ),
        ("root ::= \"abc", 1, 10, "unterminated string"),
        ("root ::= [a-", 1, 10, "unterminated character class"),
        ("root ::= [z-a]", 1, 11, "range `z-a` ends before it starts"),
        ("root ::= \"\\q\"", 1, 11, "unknown escape `\\q`"),
        ("root ::= \"\\u12\"", 1, 11, "`\\u` needs 4 hex digits"),
        ("root ::= \"\\uD800\"", 1, 11, "not a Unicode scalar value"),
        (
            "root ::= ( \"a\"\n  \"b\"",
            2,
            6,
            "expected `)` to close the `(` of line 1, column 10",
        ),
        ("root ::= \"a\" )", 1, 14, "unmatched `)`"),
        ("root ::= * \"a\"", 1, 10, "expected an item before `*`"),
        (
            "root ::= \"a\"{3,1}",
            1,
            13,
            "the maximum is below the minimum",
        ),
        ("root ::= \"a\"{x}", 1, 14, "expected a repetition count"),
        (
            "root ::= \"a\"{99999999999}",
            1,
            14,
            "repetition count above",
        ),
        (
            "root ::= a\n\n# c\nb ::= \"x\"",
            1,
            10,
            "undefined rule `a`",
        ),
        (
            "root ::= \"x\"\nroot ::= \"y\"",
            2,
            1,
            "rule `root` is already defined on line 1",
        ),
        ("# only a comment\n", 2, 1, "expected a `root` rule"),
        ("item ::= \"x\"", 1, 13, "expected a `root` rule"),
        ("root ::= <think> \"x\"", 1, 10, "token matches"),
        (
            "root ::= \"a\" ; \"b\"",
            1,
            14,
            "expected a string, a character class",
        ),
        (
            "root ::= [^\\x00-\\U0010FFFF]",
            1,
            10,
            "matches no character",
        ),
        ("::= \"a\"", 1, 1, "expected a rule definition"),
        (
            "# loops\nroot ::= \"a\" root",
            2,
            1,
            "rule `root` never finishes",
        ),
    ];
    for (gbnf, line, column, message) in cases {
        let e = to_lark(gbnf).expect_err(gbnf);
        assert_eq!((e.line, e.column), (line, column), "{gbnf:?}: {e}");
        assert!(e.message.contains(message), "{gbnf:?}: {e}");
        assert!(e
            .to_string()
            .starts_with(&format!("line {line}, column {column}: ")));
    }
}

#[test]
fn bad_input_never_panics() {
    let mut rng = Rng(7);
    let pieces = [
        "root", " ::= ", "\"a\"", "[", "]", "^", "(", ")", "|", "*", "{", "}", ",", "2", "\\", "x",
        "-", "\n", "#", ".", "\"", "é", "::=",
    ];
    for _ in 0..2000 {
        let n = rng.below(12) as usize;
        let text: String = (0..n)
            .map(|_| pieces[rng.below(pieces.len() as u64) as usize])
            .collect();
        if let Ok(out) = to_lark(&text) {
            matcher(&out);
        }
    }
}

#[test]
fn detection() {
    let cases = [
        ("root ::= \"a\"", true),
        ("# comment\n\n  root-2  ::= x\n", true),
        ("// c\nstart: \"a\"", false),
        ("start: a\na: \"::=\"", false),
        ("%llguidance {}\nstart: \"a\"", false),
        ("", false),
        ("root: x ::= y", false),
    ];
    for (text, gbnf) in cases {
        assert_eq!(is_gbnf(text), gbnf, "{text:?}");
    }
}

#[test]
fn deep_or_large_grammars_stay_bounded() {
    // A long chain of rules, and a repetition too large to analyse: both
    // translate (the analysis falls back to finer lexemes, never fails).
    let mut chain = String::from("root ::= r0 | \"(\" root \")\"\n");
    for i in 0..300 {
        chain.push_str(&format!("r{i} ::= \"a\" r{}\n", i + 1));
    }
    chain.push_str("r300 ::= [b-z]{5000} \"b\"?\n");
    let out = lark(&chain);
    matcher(&out);
    let nested = format!("root ::= {}\"a\"{}", "(".repeat(70), ")".repeat(70));
    assert!(to_lark(&nested)
        .unwrap_err()
        .message
        .contains("nested deeper"));
}

/// A random GBNF expression over the letters `abc` and rules `r0`..`r3`.
fn random_expr(rng: &mut Rng, depth: u32) -> String {
    let leaf = depth == 0 || rng.below(3) == 0;
    match rng.below(if leaf { 4 } else { 8 }) {
        0 => {
            let n = 1 + rng.below(3) as usize;
            let s: String = (0..n)
                .map(|_| ['a', 'b', 'c'][rng.below(3) as usize])
                .collect();
            format!("\"{s}\"")
        }
        1 => ["[ab]", "[a]", "[^a]", "[a-c]", "."][rng.below(5) as usize].to_string(),
        2 | 3 => format!("r{}", rng.below(4)),
        4 | 5 => {
            let n = 2 + rng.below(2);
            let items: Vec<String> = (0..n).map(|_| random_expr(rng, depth - 1)).collect();
            format!("({})", items.join(" "))
        }
        6 => format!(
            "({} | {})",
            random_expr(rng, depth - 1),
            random_expr(rng, depth - 1)
        ),
        _ => {
            let op = ["*", "+", "?", "{1,2}", "{2}"][rng.below(5) as usize];
            format!("({}){op}", random_expr(rng, depth - 1))
        }
    }
}

/// Positions where a match of `e` starting at `i` can end, given
/// `table[r][i][j]`: rule `r` matches `chars[i..j]` (so far).
fn ends(e: &Expr, chars: &[char], i: usize, table: &[Vec<Vec<bool>>]) -> Vec<usize> {
    let step = |from: &[usize], item: &Expr| -> Vec<usize> {
        let mut out: Vec<usize> = from
            .iter()
            .flat_map(|&k| ends(item, chars, k, table))
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    };
    match e {
        Expr::Empty => vec![i],
        Expr::Literal(s) => {
            let lit: Vec<char> = s.chars().collect();
            let fits = chars.get(i..i + lit.len()) == Some(&lit[..]);
            if fits {
                vec![i + lit.len()]
            } else {
                vec![]
            }
        }
        Expr::Class { negated, set } => match chars.get(i) {
            Some(&c) if Expr::class_chars(*negated, set).intersects(&CharSet::single(c)) => {
                vec![i + 1]
            }
            _ => vec![],
        },
        Expr::Ref(r) => (i..=chars.len()).filter(|&j| table[*r][i][j]).collect(),
        Expr::Seq(items) => items.iter().fold(vec![i], |cur, item| step(&cur, item)),
        Expr::Alt(alts) => alts.iter().flat_map(|a| ends(a, chars, i, table)).collect(),
        Expr::Repeat { item, min, max } => {
            let mut cur = vec![i];
            let mut out = if *min == 0 { cur.clone() } else { vec![] };
            for count in 1..=max.unwrap_or(u32::MAX) {
                cur = step(&cur, item);
                if count >= *min {
                    let before = out.len();
                    out.extend(cur.iter().copied());
                    out.sort_unstable();
                    out.dedup();
                    if out.len() == before && count > *min {
                        break;
                    }
                }
                if cur.is_empty() {
                    break;
                }
            }
            out
        }
    }
}

/// Whether the GBNF grammar matches `text`: the least fixpoint of "rule
/// `r` matches `chars[i..j]`" (left recursion and empty rules included).
fn reference_accepts(g: &Grammar, text: &str) -> bool {
    let chars: Vec<char> = text.chars().collect();
    let n = chars.len();
    let mut table = vec![vec![vec![false; n + 1]; n + 1]; g.rules.len()];
    loop {
        let mut changed = false;
        for r in 0..g.rules.len() {
            for i in 0..=n {
                for j in ends(&g.rules[r].body, &chars, i, &table) {
                    changed |= !std::mem::replace(&mut table[r][i][j], true);
                }
            }
        }
        if !changed {
            return table[g.root][0][n];
        }
    }
}

/// Random recursive grammars, where greedy lexing has every chance to go
/// wrong: every string drawn from one is accepted by its translation, and
/// on random short strings the translation agrees with a reference
/// recognizer of the GBNF.
#[test]
fn random_grammars_match_a_reference_recognizer() {
    let mut rng = Rng(0xDEAD_BEEF);
    let mut tried = 0;
    while tried < 200 {
        let rules: Vec<String> = (0..4)
            .map(|i| format!("r{i} ::= {}", random_expr(&mut rng, 3)))
            .collect();
        let gbnf = format!("root ::= r0\n{}\n", rules.join("\n"));
        // A root that never finishes is refused (see `errors_name_line_and_column`).
        let Ok(g) = parse(&gbnf) else { continue };
        let out = lark(&gbnf);
        let mut texts = Vec::new();
        for _ in 0..40 {
            let (mut text, mut fuel) = (String::new(), 60);
            if derive(&g, &Expr::Ref(g.root), &mut rng, &mut fuel, &mut text).is_some() {
                texts.push(text);
            }
        }
        if texts.is_empty() {
            continue;
        }
        tried += 1;
        for text in texts.iter().take(6) {
            assert!(
                reference_accepts(&g, text),
                "reference refuses {text:?}\n{gbnf}"
            );
            assert!(accepts(&out, text), "{text:?} refused\n{gbnf}\n{out}");
        }
        for _ in 0..6 {
            let n = rng.below(7) as usize;
            let text: String = (0..n)
                .map(|_| ['a', 'b', 'c', 'd'][rng.below(4) as usize])
                .collect();
            let want = reference_accepts(&g, &text);
            assert_eq!(accepts(&out, &text), want, "{text:?}\n{gbnf}\n{out}");
        }
    }
}
