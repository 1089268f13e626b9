//! The architecture, checked: every `crate::…`, `moestream::…`, `super::…`
//! and `self::…` path in src/ (in `use` lines and inline) is resolved to the
//! file it names, and the test fails on an import that runs up the layer
//! table of docs/ARCHITECTURE.md (a room may import only rooms below it),
//! on a circle between files, on a room missing from the table, and on a
//! loose file in src/ other than lib.rs, main.rs and error.rs.
//!
//! Test code is left out: inline `#[cfg(test)] mod … {` blocks (to the end
//! of their file) and the files named `tests.rs`, which make their data
//! with rooms above. A `#[cfg(test)] mod tests;` declaration leaves the
//! rest of its file in (the `use` lines often follow it).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The loose files src/ may hold.
const LOOSE: [&str; 3] = ["lib", "main", "error"];

/// One source file: its module path and what it names.
struct File {
    /// `["engine", "gbnf", "parse"]`; `[]` for lib.rs and main.rs.
    module: Vec<String>,
    /// In the binary (src/main.rs, src/cli/): `crate::` is the binary.
    in_bin: bool,
    text: String,
}

/// The rooms of the layer table, top to bottom.
fn layer_table(doc: &str) -> Vec<String> {
    let start = doc
        .find("## The layer table")
        .expect("docs/ARCHITECTURE.md has a `## The layer table` section");
    doc[start..]
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .filter_map(|l| l.split('|').nth(1))
        .map(|c| c.trim().trim_matches('`').trim_end_matches('/').to_string())
        .collect()
}

/// Code without comments, string and char literals, and test modules.
fn code_of(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut chars = src.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '/' if chars.peek() == Some(&'/') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            '/' if chars.peek() == Some(&'*') => {
                let mut prev = ' ';
                for c in chars.by_ref() {
                    if prev == '*' && c == '/' {
                        break;
                    }
                    prev = c;
                }
            }
            '"' => {
                let mut escaped = false;
                for c in chars.by_ref() {
                    if !escaped && c == '"' {
                        break;
                    }
                    escaped = !escaped && c == '\\';
                }
                out.push_str("\"\"");
            }
            _ => out.push(c),
        }
    }
    let mut from = 0;
    while let Some(i) = out[from..].find("#[cfg(test)]").map(|i| from + i) {
        let after = out[i..].trim_start_matches("#[cfg(test)]").trim_start();
        let inline = after
            .find('{')
            .is_some_and(|b| after.find(';').is_none_or(|s| b < s));
        if after.starts_with("mod ") && inline {
            out.truncate(i);
            break;
        }
        from = i + 1;
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The paths of one `use` tree (`a::{b, c::d}` → `a::b`, `a::c::d`).
fn expand(prefix: &[String], tree: &str, out: &mut Vec<Vec<String>>) {
    let tree = tree.trim();
    if let Some(open) = tree.find('{') {
        let base: Vec<String> = split_path(&tree[..open]);
        let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
        let mut path = prefix.to_vec();
        path.extend(base);
        let (mut depth, mut from) = (0, 0);
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    expand(&path, &inner[from..i], out);
                    from = i + 1;
                }
                _ => {}
            }
        }
        expand(&path, &inner[from..], out);
        return;
    }
    let head = tree.split(" as ").next().unwrap_or("");
    let mut path = prefix.to_vec();
    path.extend(split_path(head));
    if path.len() > prefix.len() {
        out.push(path);
    }
}

fn split_path(s: &str) -> Vec<String> {
    s.split("::")
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect()
}

/// Every path a file names: its `use` trees and its inline paths.
fn paths_of(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("use ") {
        let before = rest[..i].chars().next_back();
        let after = &rest[i + 4..];
        if before.is_none_or(|c| !is_ident(c)) {
            let end = after.find(';').unwrap_or(after.len());
            expand(&[], &after[..end], &mut out);
        }
        rest = after;
    }
    for head in ["crate::", "moestream::", "super::", "self::"] {
        let mut from = 0;
        while let Some(i) = code[from..].find(head) {
            let at = from + i;
            let before = code[..at].chars().next_back();
            from = at + head.len();
            if before.is_some_and(|c| is_ident(c) || c == ':') {
                continue;
            }
            let end = code[at..]
                .find(|c: char| !(is_ident(c) || c == ':'))
                .map_or(code.len(), |e| at + e);
            out.push(split_path(&code[at..end]));
        }
    }
    out
}

/// The file `path` (named in `from`) lands in, if it is one of ours.
fn resolve(files: &BTreeMap<PathBuf, File>, from: &File, path: &[String]) -> Option<PathBuf> {
    let (head, tail) = path.split_first()?;
    let abs: Vec<String> = match head.as_str() {
        "crate" if from.in_bin => {
            // The binary's own modules are the cli room.
            tail.to_vec()
        }
        "crate" | "moestream" => tail.to_vec(),
        "super" | "self" => {
            let mut base = from.module.clone();
            let mut rest = path;
            while let Some((h, t)) = rest.split_first() {
                match h.as_str() {
                    "super" => {
                        base.pop();
                    }
                    "self" => {}
                    _ => break,
                }
                rest = t;
            }
            base.extend(rest.iter().cloned());
            base
        }
        _ => return None,
    };
    (1..=abs.len()).rev().find_map(|k| {
        files
            .iter()
            .find(|(_, f)| f.module == abs[..k])
            .map(|(p, _)| p.clone())
    })
}

/// Every .rs file under `src`, test files left out.
fn read_tree(src: &Path) -> BTreeMap<PathBuf, File> {
    let mut files = BTreeMap::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") || path.ends_with("tests.rs") {
                continue;
            }
            let rel = path.strip_prefix(src).unwrap().with_extension("");
            let mut module: Vec<String> = rel
                .iter()
                .map(|c| c.to_string_lossy().into_owned())
                .collect();
            if module.last().is_some_and(|m| m == "mod") {
                module.pop();
            }
            if module == ["lib"] || module == ["main"] {
                module.clear();
            }
            let in_bin = rel.starts_with("cli") || rel == Path::new("main");
            let text = code_of(&std::fs::read_to_string(&path).unwrap());
            files.insert(
                rel,
                File {
                    module,
                    in_bin,
                    text,
                },
            );
        }
    }
    files
}

/// Arrows between files.
fn arrows(files: &BTreeMap<PathBuf, File>) -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
    let mut out: BTreeMap<PathBuf, BTreeSet<PathBuf>> = BTreeMap::new();
    for (p, f) in files {
        for path in paths_of(&f.text) {
            // From the binary, `crate::` names the cli room's own files.
            let path = match (f.in_bin, path.first().map(String::as_str)) {
                (true, Some("crate")) if path.get(1).is_some_and(|m| m != "cli") => continue,
                _ => path,
            };
            if let Some(to) = resolve(files, f, &path) {
                if &to != p {
                    out.entry(p.clone()).or_default().insert(to);
                }
            }
        }
    }
    out
}

fn room_of(rel: &Path) -> String {
    rel.iter()
        .next()
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Arrows that run up `table` (or leave it).
fn upward(table: &[String], arrows: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Vec<String> {
    let rank = |r: &str| table.iter().position(|t| t == r);
    let mut bad = Vec::new();
    for (from, tos) in arrows {
        let rf = room_of(from);
        for to in tos {
            let rt = room_of(to);
            if rf == rt || ["lib", "main"].contains(&rt.as_str()) {
                continue;
            }
            match (rank(&rf), rank(&rt)) {
                (Some(a), Some(b)) if b > a => {}
                _ => bad.push(format!(
                    "{} -> {} ({rf} -> {rt})",
                    from.display(),
                    to.display()
                )),
            }
        }
    }
    bad
}

/// The files of each circle (strongly connected set of two or more).
fn circles(arrows: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Vec<Vec<PathBuf>> {
    let nodes: BTreeSet<&PathBuf> = arrows
        .iter()
        .flat_map(|(a, bs)| std::iter::once(a).chain(bs))
        .collect();
    let reach = |start: &PathBuf| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![start.clone()];
        while let Some(n) = stack.pop() {
            for m in arrows.get(&n).into_iter().flatten() {
                if seen.insert(m.clone()) {
                    stack.push(m.clone());
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&PathBuf, BTreeSet<PathBuf>> =
        nodes.iter().map(|n| (*n, reach(n))).collect();
    let mut done = BTreeSet::new();
    let mut out = Vec::new();
    for n in &nodes {
        if done.contains(*n) || !reached[n].contains(*n) {
            continue;
        }
        let circle: Vec<PathBuf> = reached[n]
            .iter()
            .filter(|m| reached[m].contains(*n))
            .cloned()
            .collect();
        done.extend(circle.iter().cloned());
        out.push(circle);
    }
    out
}

#[test]
fn imports_point_down_the_layer_table_and_no_file_is_in_a_circle() {
    let doc = std::fs::read_to_string(Path::new(ROOT).join("docs/ARCHITECTURE.md")).unwrap();
    let table = layer_table(&doc);
    let files = read_tree(&Path::new(ROOT).join("src"));
    let mut problems = Vec::new();
    for rel in files.keys() {
        let room = room_of(rel);
        let loose = rel.components().count() == 1;
        if loose && !LOOSE.contains(&room.as_str()) {
            problems.push(format!(
                "loose file src/{}.rs: put it in a room",
                rel.display()
            ));
        }
        if !loose && !table.contains(&room) {
            problems.push(format!("room {room}/ is not in the layer table"));
        }
    }
    let arrows = arrows(&files);
    problems.extend(
        upward(&table, &arrows)
            .into_iter()
            .map(|a| format!("arrow up: {a}")),
    );
    for c in circles(&arrows) {
        let names: Vec<String> = c.iter().map(|p| p.display().to_string()).collect();
        problems.push(format!("circle: {}", names.join(" <-> ")));
    }
    problems.sort();
    problems.dedup();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

fn fake(files: &[(&str, &str)]) -> BTreeMap<PathBuf, File> {
    files
        .iter()
        .map(|(rel, text)| {
            let rel = PathBuf::from(rel);
            let module = rel
                .iter()
                .map(|c| c.to_string_lossy().into_owned())
                .collect();
            let file = File {
                module,
                in_bin: false,
                text: code_of(text),
            };
            (rel, file)
        })
        .collect()
}

#[test]
fn the_checker_sees_an_arrow_up_and_a_circle() {
    let table: Vec<String> = ["engine", "model", "kernels"].map(String::from).to_vec();
    let files = fake(&[
        ("engine/run", "use crate::model::{forward::{Step, go}, w};"),
        ("model/forward", "fn f() { crate::kernels::dot(); }"),
        (
            "model/w",
            "use super::forward::Step; // crate::engine::run in a comment",
        ),
        (
            "kernels/dot",
            "pub fn dot() { let s = \"crate::engine::run\"; }",
        ),
    ]);
    let a = arrows(&files);
    assert!(upward(&table, &a).is_empty(), "{:?}", upward(&table, &a));
    assert!(circles(&a).is_empty());

    let files = fake(&[
        ("model/forward", "use crate::model::w::X;"),
        ("model/w", "pub struct X; fn g() { super::forward::f() }"),
        ("kernels/dot", "use crate::engine::run as r;"),
        (
            "engine/run",
            "#[cfg(test)]\nmod tests { use crate::kernels::dot; }",
        ),
        (
            "kernels/pack",
            "#[cfg(test)]\nmod tests;\nuse crate::model::w::X;",
        ),
    ]);
    let a = arrows(&files);
    assert_eq!(
        upward(&table, &a),
        [
            "kernels/dot -> engine/run (kernels -> engine)",
            "kernels/pack -> model/w (kernels -> model)"
        ]
    );
    assert_eq!(
        circles(&a),
        [vec![
            PathBuf::from("model/forward"),
            PathBuf::from("model/w")
        ]]
    );
}

#[test]
fn the_layer_table_is_read_from_the_document() {
    let doc = "# A\n\n## The layer table\n\nTop first.\n\n| room | holds |\n| --- | --- |\n| `cli/` | flags |\n| `fs/` | files |\n\nAfter.\n";
    assert_eq!(layer_table(doc), ["cli", "fs"]);
}
