//! The lexeme plan: which pieces of a GBNF grammar become llguidance
//! lexemes, and which stay grammar rules.
//!
//! GBNF has no lexer: its rules work on characters. llguidance lexes
//! greedily: a lexeme ends only when the next byte continues no lexeme
//! allowed there. Making every character class its own lexeme would be
//! exact but slow (llguidance refuses masks that need too many Earley
//! items); making every regular piece one lexeme would be fast but wrong
//! where a lexeme can swallow what follows it (`[a-z]+ "s"`). The plan
//! starts coarse and splits exactly the lexemes that can go wrong:
//!
//! 1. Rules that reach no cycle are *regular*. The maximal regular pieces
//!    of the other rules (runs of a sequence, the regular alternatives of
//!    a choice) start as one lexeme each; a regular `root` is one lexeme.
//! 2. For each lexeme A, with F the characters that can follow it, and
//!    each lexeme B that can be allowed where A is (see [`super::flow`]): if
//!    a non-empty match of A, then a character whose UTF-8 encoding starts
//!    with the same byte as one of F, can begin a match of B, the lexer
//!    could run past A's end, so B is split one level: a string into its
//!    characters, a sequence into its items, a choice into its
//!    alternatives, a repetition into a repeated lexeme, a rule reference
//!    into a rule.
//! 3. Repeat until no pair conflicts. One-code-point lexemes never
//!    conflict, so this ends; should the work bound run out first, every
//!    lexeme becomes one code point (exact, slower).
//!
//! With no conflicting pair, greedy lexing ends every lexeme where some
//! GBNF parse ends it, so the translation accepts exactly the GBNF
//! language.

use super::ast::{Expr, Grammar};
use super::charset::CharSet;
use super::flow::{Flow, Node};
use super::nfa::{extends_into, share_a_string, Nfa};
use std::collections::{HashMap, HashSet};

/// Most rounds of splitting before falling back to one-code-point lexemes.
const ROUNDS_MAX: usize = 64;
/// Most pairs of automaton states visited for one pair of lexemes.
const PAIR_BUDGET: usize = 20_000;
/// Most pairs of automaton states visited for the whole plan.
const PLAN_BUDGET: usize = 4_000_000;

/// The rule-level grammar and its lexemes.
pub(super) struct LexemePlan {
    /// Regular expressions, each one lexeme; their rule references name
    /// regular rules only.
    pub lexemes: Vec<Expr>,
    /// The rule-level body of each rule used at rule level (`root`'s
    /// included); `None` for rules used only inside lexemes, or not at all.
    pub bodies: Vec<Option<Node>>,
}

/// Chooses the lexemes of `g`.
pub(super) fn plan(g: &Grammar) -> LexemePlan {
    let mut b = Builder::new(g, false);
    let mut budget = PLAN_BUDGET;
    for _ in 0..ROUNDS_MAX {
        let Some(doomed) = b.conflicts(&mut budget) else {
            break;
        };
        if doomed.is_empty() {
            return b.into_plan();
        }
        b.split_all(&doomed);
    }
    atomic_plan(g)
}

/// The plan whose lexemes are all one code point: exact without any
/// analysis (a lexeme of one code point cannot run on), and slower.
pub(super) fn atomic_plan(g: &Grammar) -> LexemePlan {
    Builder::new(g, true).into_plan()
}

/// Whether `e` matches exactly one code point (it cannot be split).
fn is_atom(e: &Expr) -> bool {
    match e {
        Expr::Class { .. } => true,
        Expr::Literal(s) => s.chars().count() == 1,
        _ => false,
    }
}

fn collect_refs(e: &Expr, out: &mut HashSet<usize>) {
    match e {
        Expr::Ref(r) => {
            out.insert(*r);
        }
        Expr::Seq(v) | Expr::Alt(v) => v.iter().for_each(|x| collect_refs(x, out)),
        Expr::Repeat { item, .. } => collect_refs(item, out),
        Expr::Empty | Expr::Literal(_) | Expr::Class { .. } => {}
    }
}

/// Which rules reach no cycle, and an order of them in which every rule
/// comes after the rules it references.
fn regular_rules(g: &Grammar) -> (Vec<bool>, Vec<usize>) {
    let n = g.rules.len();
    let mut users = vec![Vec::new(); n];
    let mut pending = vec![0usize; n];
    for (r, rule) in g.rules.iter().enumerate() {
        let mut refs = HashSet::new();
        collect_refs(&rule.body, &mut refs);
        pending[r] = refs.len();
        for x in refs {
            users[x].push(r);
        }
    }
    let mut order: Vec<usize> = (0..n).filter(|&r| pending[r] == 0).collect();
    let mut next = 0;
    while let Some(&done) = order.get(next) {
        next += 1;
        for &u in &users[done] {
            pending[u] -= 1;
            if pending[u] == 0 {
                order.push(u);
            }
        }
    }
    let mut regular = vec![false; n];
    for &r in &order {
        regular[r] = true;
    }
    (regular, order)
}

/// The first code points of the non-empty strings of `e`, and whether it
/// matches the empty string; `rules` holds that of every rule `e` names.
fn first_of(e: &Expr, rules: &[(CharSet, bool)]) -> (CharSet, bool) {
    match e {
        Expr::Empty => (CharSet::default(), true),
        Expr::Literal(s) => match s.chars().next() {
            Some(c) => (CharSet::single(c), false),
            None => (CharSet::default(), true),
        },
        Expr::Class { negated, set } => (Expr::class_chars(*negated, set), false),
        Expr::Ref(r) => rules[*r].clone(),
        Expr::Seq(items) => {
            let mut first = CharSet::default();
            for item in items {
                let (f, nullable) = first_of(item, rules);
                first.add(&f);
                if !nullable {
                    return (first, false);
                }
            }
            (first, true)
        }
        Expr::Alt(alts) => {
            let mut first = CharSet::default();
            let mut nullable = false;
            for a in alts {
                let (f, n) = first_of(a, rules);
                first.add(&f);
                nullable |= n;
            }
            (first, nullable)
        }
        Expr::Repeat { item, min, .. } => {
            let (f, nullable) = first_of(item, rules);
            (f, *min == 0 || nullable)
        }
    }
}

/// Builds the plan: rule-level bodies and their lexemes.
struct Builder<'g> {
    g: &'g Grammar,
    regular: Vec<bool>,
    /// First set and nullability of each regular rule.
    info: Vec<(CharSet, bool)>,
    /// Make every lexeme one code point.
    atomic: bool,
    lexemes: Vec<Expr>,
    bodies: Vec<Option<Node>>,
    queued: Vec<bool>,
    queue: Vec<usize>,
}

impl<'g> Builder<'g> {
    fn new(g: &'g Grammar, atomic: bool) -> Builder<'g> {
        let n = g.rules.len();
        let (regular, order) = regular_rules(g);
        let mut info = vec![(CharSet::default(), false); n];
        for r in order {
            info[r] = first_of(&g.rules[r].body, &info);
        }
        let mut b = Builder {
            g,
            regular,
            info,
            atomic,
            lexemes: Vec::new(),
            bodies: vec![None; n],
            queued: vec![false; n],
            queue: Vec::new(),
        };
        b.rule_ref(g.root);
        b.drain();
        b
    }

    fn into_plan(self) -> LexemePlan {
        LexemePlan {
            lexemes: self.lexemes,
            bodies: self.bodies,
        }
    }

    fn is_regular(&self, e: &Expr) -> bool {
        match e {
            Expr::Ref(r) => self.regular[*r],
            Expr::Seq(v) | Expr::Alt(v) => v.iter().all(|x| self.is_regular(x)),
            Expr::Repeat { item, .. } => self.is_regular(item),
            Expr::Empty | Expr::Literal(_) | Expr::Class { .. } => true,
        }
    }

    /// A reference to rule `r` at rule level (its body is built later).
    fn rule_ref(&mut self, r: usize) -> Node {
        if !std::mem::replace(&mut self.queued[r], true) {
            self.queue.push(r);
        }
        Node::Ref(r)
    }

    /// Builds the bodies of the rules referenced so far.
    fn drain(&mut self) {
        while let Some(r) = self.queue.pop() {
            let g = self.g;
            let body = self.node_of(&g.rules[r].body);
            self.bodies[r] = Some(body);
        }
    }

    /// `e` as one lexeme (in atomic mode: split down to code points).
    fn lex(&mut self, e: &Expr) -> Node {
        if *e == Expr::Empty {
            return Node::Empty;
        }
        if self.atomic && !is_atom(e) {
            return self.split(e);
        }
        self.lexemes.push(e.clone());
        Node::Lex(self.lexemes.len() - 1)
    }

    /// `e` at rule level: its maximal regular pieces become lexemes.
    fn node_of(&mut self, e: &Expr) -> Node {
        if self.is_regular(e) {
            return self.lex(e);
        }
        match e {
            Expr::Ref(r) => self.rule_ref(*r),
            Expr::Seq(items) => self.seq_node(items),
            Expr::Alt(alts) => self.alt_node(alts),
            Expr::Repeat { item, min, max } => Node::Repeat {
                item: Box::new(self.node_of(item)),
                min: *min,
                max: *max,
            },
            Expr::Empty | Expr::Literal(_) | Expr::Class { .. } => self.lex(e),
        }
    }

    /// A sequence whose runs of regular items are one lexeme each.
    fn seq_node(&mut self, items: &[Expr]) -> Node {
        let mut nodes = Vec::new();
        let mut run = Vec::new();
        for item in items {
            if self.is_regular(item) {
                run.push(item.clone());
                continue;
            }
            self.flush_run(&mut run, &mut nodes);
            nodes.push(self.node_of(item));
        }
        self.flush_run(&mut run, &mut nodes);
        Node::Seq(nodes)
    }

    fn flush_run(&mut self, run: &mut Vec<Expr>, nodes: &mut Vec<Node>) {
        if !run.is_empty() {
            let e = Expr::seq(std::mem::take(run));
            nodes.push(self.lex(&e));
        }
    }

    /// A choice whose regular alternatives are one lexeme together (in
    /// the place of the first of them).
    fn alt_node(&mut self, alts: &[Expr]) -> Node {
        let mut nodes = Vec::new();
        let mut slot = None;
        let mut regular = Vec::new();
        for a in alts {
            if !self.is_regular(a) {
                nodes.push(self.node_of(a));
                continue;
            }
            if slot.is_none() {
                slot = Some(nodes.len());
                nodes.push(Node::Empty);
            }
            regular.push(a.clone());
        }
        if let Some(i) = slot {
            nodes[i] = self.lex(&Expr::alt(regular));
        }
        Node::Alt(nodes)
    }

    /// `e`, a lexeme, one level finer (an atom stays as it is).
    fn split(&mut self, e: &Expr) -> Node {
        match e {
            Expr::Literal(s) if !is_atom(e) => {
                let chars = s.chars().map(|c| Expr::Literal(c.to_string()));
                Node::Seq(chars.map(|c| self.lex(&c)).collect())
            }
            Expr::Seq(items) => Node::Seq(items.iter().map(|i| self.lex(i)).collect()),
            Expr::Alt(alts) => Node::Alt(alts.iter().map(|a| self.lex(a)).collect()),
            Expr::Repeat { item, min, max } => Node::Repeat {
                item: Box::new(self.lex(item)),
                min: *min,
                max: *max,
            },
            Expr::Ref(r) => self.rule_ref(*r),
            Expr::Empty => Node::Empty,
            Expr::Literal(_) | Expr::Class { .. } => {
                self.lexemes.push(e.clone());
                Node::Lex(self.lexemes.len() - 1)
            }
        }
    }

    /// Splits the lexemes `doomed` wherever they occur.
    fn split_all(&mut self, doomed: &HashSet<usize>) {
        let mut bodies = std::mem::take(&mut self.bodies);
        for body in bodies.iter_mut().flatten() {
            self.replace(body, doomed);
        }
        self.bodies = bodies;
        self.drain();
    }

    fn replace(&mut self, node: &mut Node, doomed: &HashSet<usize>) {
        match node {
            Node::Lex(id) if doomed.contains(id) => {
                let e = self.lexemes[*id].clone();
                *node = self.split(&e);
            }
            Node::Seq(v) | Node::Alt(v) => v.iter_mut().for_each(|n| self.replace(n, doomed)),
            Node::Repeat { item, .. } => self.replace(item, doomed),
            Node::Empty | Node::Lex(_) | Node::Ref(_) => {}
        }
    }

    /// The lexemes used by the rule-level bodies.
    fn live(&self) -> Vec<usize> {
        fn walk(n: &Node, out: &mut Vec<usize>) {
            match n {
                Node::Lex(id) => out.push(*id),
                Node::Seq(v) | Node::Alt(v) => v.iter().for_each(|x| walk(x, out)),
                Node::Repeat { item, .. } => walk(item, out),
                Node::Empty | Node::Ref(_) => {}
            }
        }
        let mut out = Vec::new();
        self.bodies.iter().flatten().for_each(|b| walk(b, &mut out));
        out
    }

    /// The lexemes to split this round (`None`: the work bound ran out).
    fn conflicts(&self, budget: &mut usize) -> Option<HashSet<usize>> {
        let live = self.live();
        let firsts = live
            .iter()
            .map(|&id| (id, first_of(&self.lexemes[id], &self.info)))
            .collect();
        let flow = Flow::new(&self.bodies, self.g.root, firsts);
        let nfas = live
            .iter()
            .map(|&id| (id, Nfa::of(&self.lexemes[id], &self.g.rules)))
            .collect();
        let mut check = Checker {
            nfas,
            flow: &flow,
            twins: HashMap::new(),
            budget,
        };
        let rivals = flow.rivals(|a, b| check.twins(a, b));
        let mut doomed = HashSet::new();
        for &a in &live {
            let follow = flow.lex_follow(a).same_lead_byte();
            for &b in rivals.get(&a).into_iter().flatten() {
                if !follow.is_empty()
                    && !doomed.contains(&b)
                    && !is_atom(&self.lexemes[b])
                    && check.runs_into(a, &follow, b)
                {
                    doomed.insert(b);
                }
            }
        }
        (*check.budget > 0).then_some(doomed)
    }
}

/// Bounded questions about pairs of live lexemes; an unknown answer (an
/// automaton too large, a budget spent) counts as yes, the safe side.
struct Checker<'a> {
    nfas: HashMap<usize, Option<Nfa>>,
    flow: &'a Flow,
    twins: HashMap<(usize, usize), bool>,
    /// Pairs of automaton states left to visit in this plan.
    budget: &'a mut usize,
}

impl Checker<'_> {
    /// Whether lexemes `a` and `b` can match one string.
    fn twins(&mut self, a: usize, b: usize) -> bool {
        let key = (a.min(b), a.max(b));
        if let Some(&known) = self.twins.get(&key) {
            return known;
        }
        let twins = self.flow.lex_first(a).intersects(self.flow.lex_first(b))
            && self.ask(a, b, share_a_string);
        self.twins.insert(key, twins);
        twins
    }

    /// Whether a match of `a` followed by a code point of `follow` can
    /// begin a match of `b`.
    fn runs_into(&mut self, a: usize, follow: &CharSet, b: usize) -> bool {
        self.flow.lex_first(a).intersects(self.flow.lex_first(b))
            && self.ask(a, b, |na, nb, left| extends_into(na, follow, nb, left))
    }

    fn ask(
        &mut self,
        a: usize,
        b: usize,
        query: impl FnOnce(&Nfa, &Nfa, &mut usize) -> Option<bool>,
    ) -> bool {
        let (Some(Some(na)), Some(Some(nb))) = (self.nfas.get(&a), self.nfas.get(&b)) else {
            return true;
        };
        let allowed = PAIR_BUDGET.min(*self.budget);
        let mut left = allowed;
        let answer = query(na, nb, &mut left);
        *self.budget -= allowed - left;
        answer.unwrap_or(true)
    }
}
