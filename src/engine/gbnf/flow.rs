//! First and follow sets of the rule-level grammar of a lexeme plan: the
//! code points and the lexemes that can come first in a node, and those
//! that can come right after each lexeme.
//!
//! The lexemes llguidance allows at one position are among those that can
//! come right after the lexemes matched last (or first in the output), so
//! two lexemes that are never in one such set never meet in the lexer.

use super::charset::CharSet;
use std::collections::{BTreeSet, HashMap, HashSet};

/// A rule-level expression: what stays grammar structure in the Lark
/// output.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Node {
    Empty,
    /// One lexeme: an index into [`super::lexemes::LexemePlan::lexemes`].
    Lex(usize),
    /// A rule, by index; it has a rule-level body in [`super::lexemes::LexemePlan::bodies`].
    Ref(usize),
    Seq(Vec<Node>),
    Alt(Vec<Node>),
    Repeat {
        item: Box<Node>,
        min: u32,
        max: Option<u32>,
    },
}

/// What can come next: code points and lexemes.
#[derive(Clone, Debug, Default)]
struct Next {
    chars: CharSet,
    lexes: BTreeSet<usize>,
}

impl Next {
    /// Adds `other`; returns whether anything was new.
    fn add(&mut self, other: &Next) -> bool {
        let grew = self.chars.add(&other.chars);
        let before = self.lexes.len();
        self.lexes.extend(other.lexes.iter().copied());
        grew || self.lexes.len() > before
    }
}

/// First and follow sets of one plan.
pub(super) struct Flow {
    /// First code points and nullability of each live lexeme.
    lex: HashMap<usize, (CharSet, bool)>,
    /// First set and nullability of each rule-level rule.
    rules: Vec<(Next, bool)>,
    /// What can follow each live lexeme.
    follow: HashMap<usize, Next>,
    /// What can begin the output.
    start: Next,
}

impl Flow {
    /// The sets of the rule-level `bodies` starting at `root`, given each
    /// live lexeme's first code points and nullability.
    pub(super) fn new(
        bodies: &[Option<Node>],
        root: usize,
        lex: HashMap<usize, (CharSet, bool)>,
    ) -> Flow {
        let mut flow = Flow {
            lex,
            rules: vec![(Next::default(), false); bodies.len()],
            follow: HashMap::new(),
            start: Next::default(),
        };
        flow.rule_firsts(bodies);
        flow.start = flow.rules[root].0.clone();
        flow.follows(bodies);
        flow
    }

    /// The first code points of lexeme `id`.
    pub(super) fn lex_first(&self, id: usize) -> &CharSet {
        static EMPTY: CharSet = CharSet::EMPTY;
        self.lex.get(&id).map_or(&EMPTY, |(f, _)| f)
    }

    /// The code points that can follow lexeme `id`.
    pub(super) fn lex_follow(&self, id: usize) -> &CharSet {
        static EMPTY: CharSet = CharSet::EMPTY;
        self.follow.get(&id).map_or(&EMPTY, |n| &n.chars)
    }

    /// For each lexeme, the lexemes (itself included) that can be allowed
    /// at a position where it is. `twins(a, b)` tells whether lexemes `a`
    /// and `b` can match one string (then both match at once, and what
    /// can follow either is allowed next: their follow sets join).
    pub(super) fn rivals(
        &self,
        mut twins: impl FnMut(usize, usize) -> bool,
    ) -> HashMap<usize, HashSet<usize>> {
        let mut next: HashMap<usize, BTreeSet<usize>> = self
            .follow
            .iter()
            .map(|(&x, n)| (x, n.lexes.clone()))
            .collect();
        loop {
            let rivals = group_rivals(std::iter::once(&self.start.lexes).chain(next.values()));
            let mut changed = false;
            for (&a, group) in &rivals {
                for &b in group {
                    if a == b || !twins(a, b) {
                        continue;
                    }
                    let extra = next.get(&b).cloned().unwrap_or_default();
                    let mine = next.entry(a).or_default();
                    let before = mine.len();
                    mine.extend(extra);
                    changed |= mine.len() > before;
                }
            }
            if !changed {
                return rivals;
            }
        }
    }

    fn rule_firsts(&mut self, bodies: &[Option<Node>]) {
        loop {
            let mut changed = false;
            for (r, body) in bodies.iter().enumerate() {
                let Some(body) = body else { continue };
                let (f, nullable) = self.first(body);
                changed |= self.rules[r].0.add(&f);
                if nullable && !self.rules[r].1 {
                    self.rules[r].1 = true;
                    changed = true;
                }
            }
            if !changed {
                return;
            }
        }
    }

    /// What can come first in `n`, and whether `n` matches the empty
    /// string.
    fn first(&self, n: &Node) -> (Next, bool) {
        match n {
            Node::Empty => (Next::default(), true),
            Node::Lex(id) => {
                let (chars, nullable) = self.lex.get(id).cloned().unwrap_or_default();
                let lexes = BTreeSet::from([*id]);
                (Next { chars, lexes }, nullable)
            }
            Node::Ref(r) => self.rules[*r].clone(),
            Node::Seq(items) => {
                let mut first = Next::default();
                for item in items {
                    let (f, nullable) = self.first(item);
                    first.add(&f);
                    if !nullable {
                        return (first, false);
                    }
                }
                (first, true)
            }
            Node::Alt(alts) => alts.iter().fold((Next::default(), false), |mut acc, a| {
                let (f, nullable) = self.first(a);
                acc.0.add(&f);
                (acc.0, acc.1 || nullable)
            }),
            Node::Repeat { item, min, .. } => {
                let (f, nullable) = self.first(item);
                (f, *min == 0 || nullable)
            }
        }
    }

    /// Fills `follow` for every live lexeme (a fixpoint over the rules;
    /// the end of the output needs no entry: nothing can run into it).
    fn follows(&mut self, bodies: &[Option<Node>]) {
        let mut rule_follow = vec![Next::default(); bodies.len()];
        loop {
            self.follow.clear();
            let mut changed = false;
            for (r, body) in bodies.iter().enumerate() {
                let Some(body) = body else { continue };
                let after = rule_follow[r].clone();
                changed |= self.walk(body, &after, &mut rule_follow);
            }
            if !changed {
                return;
            }
        }
    }

    /// Records that `after` can follow `n`; returns whether a rule's
    /// follow set grew.
    fn walk(&mut self, n: &Node, after: &Next, rule_follow: &mut [Next]) -> bool {
        match n {
            Node::Empty => false,
            Node::Lex(id) => {
                self.follow.entry(*id).or_default().add(after);
                false
            }
            Node::Ref(r) => rule_follow[*r].add(after),
            Node::Seq(items) => {
                let mut changed = false;
                let mut cur = after.clone();
                for item in items.iter().rev() {
                    changed |= self.walk(item, &cur, rule_follow);
                    let (f, nullable) = self.first(item);
                    if !nullable {
                        cur = Next::default();
                    }
                    cur.add(&f);
                }
                changed
            }
            Node::Alt(alts) => alts
                .iter()
                .fold(false, |ch, a| self.walk(a, after, rule_follow) | ch),
            Node::Repeat { item, max, .. } => {
                let mut inner = after.clone();
                if *max != Some(1) {
                    inner.add(&self.first(item).0);
                }
                self.walk(item, &inner, rule_follow)
            }
        }
    }
}

/// For each lexeme of the `groups`, every lexeme sharing a group with it.
fn group_rivals<'a>(
    groups: impl Iterator<Item = &'a BTreeSet<usize>>,
) -> HashMap<usize, HashSet<usize>> {
    let groups: HashSet<&BTreeSet<usize>> = groups.collect();
    let mut rivals: HashMap<usize, HashSet<usize>> = HashMap::new();
    for group in groups {
        for &a in group {
            rivals.entry(a).or_default().extend(group.iter().copied());
        }
    }
    rivals
}
