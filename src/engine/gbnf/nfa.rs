//! Thompson automata over code-point sets, built from regular GBNF
//! expressions, and the one question the lexeme plan asks of two of them:
//! can a match of one lexeme, followed by a given character, be the start
//! of a match of another? Every search is bounded; `None` means the bound
//! was hit and the answer is unknown (callers then assume the worst).

use super::ast::{Expr, Rule};
use super::charset::CharSet;
use std::collections::HashSet;

/// Most states of one automaton.
const STATES_MAX: usize = 4096;
/// Deepest chain of rule references inlined into one automaton.
const REF_DEPTH_MAX: usize = 64;

/// An automaton with one start and one accepting state.
pub(super) struct Nfa {
    eps: Vec<Vec<u32>>,
    edges: Vec<Vec<(CharSet, u32)>>,
    start: u32,
    accept: u32,
}

impl Nfa {
    /// The automaton of `e` (its rule references inlined from `rules`);
    /// `None` when it would exceed the size bounds.
    pub(super) fn of(e: &Expr, rules: &[Rule]) -> Option<Nfa> {
        let mut b = Builder {
            rules,
            depth: 0,
            nfa: Nfa {
                eps: Vec::new(),
                edges: Vec::new(),
                start: 0,
                accept: 1,
            },
        };
        let (start, accept) = (b.state()?, b.state()?);
        b.wire(e, start, accept)?;
        Some(b.nfa)
    }

    fn len(&self) -> usize {
        self.eps.len()
    }

    /// The states from which the accepting state is reachable.
    fn coreachable(&self) -> Vec<bool> {
        let mut back = vec![Vec::new(); self.len()];
        for s in 0..self.len() {
            let targets = self.eps[s]
                .iter()
                .chain(self.edges[s].iter().map(|(_, t)| t));
            for &t in targets {
                back[t as usize].push(s as u32);
            }
        }
        let mut seen = vec![false; self.len()];
        let mut stack = vec![self.accept];
        seen[self.accept as usize] = true;
        while let Some(s) = stack.pop() {
            for &p in &back[s as usize] {
                if !std::mem::replace(&mut seen[p as usize], true) {
                    stack.push(p);
                }
            }
        }
        seen
    }
}

struct Builder<'g> {
    rules: &'g [Rule],
    depth: usize,
    nfa: Nfa,
}

impl Builder<'_> {
    fn state(&mut self) -> Option<u32> {
        if self.nfa.len() >= STATES_MAX {
            return None;
        }
        self.nfa.eps.push(Vec::new());
        self.nfa.edges.push(Vec::new());
        Some(self.nfa.len() as u32 - 1)
    }

    fn eps(&mut self, from: u32, to: u32) {
        self.nfa.eps[from as usize].push(to);
    }

    fn edge(&mut self, from: u32, set: CharSet, to: u32) {
        self.nfa.edges[from as usize].push((set, to));
    }

    /// Adds paths from `from` to `to` spelling exactly the strings of `e`
    /// (through fresh states only).
    fn wire(&mut self, e: &Expr, from: u32, to: u32) -> Option<()> {
        match e {
            Expr::Empty => self.eps(from, to),
            Expr::Literal(s) => self.literal(s, from, to)?,
            Expr::Class { negated, set } => self.edge(from, Expr::class_chars(*negated, set), to),
            Expr::Ref(r) => {
                if self.depth >= REF_DEPTH_MAX {
                    return None;
                }
                self.depth += 1;
                let rules = self.rules;
                let wired = self.wire(&rules[*r].body, from, to);
                self.depth -= 1;
                wired?;
            }
            Expr::Seq(items) => {
                let mut cur = from;
                for (i, item) in items.iter().enumerate() {
                    let next = if i + 1 == items.len() {
                        to
                    } else {
                        self.state()?
                    };
                    self.wire(item, cur, next)?;
                    cur = next;
                }
            }
            Expr::Alt(alts) => {
                for a in alts {
                    self.wire(a, from, to)?;
                }
            }
            Expr::Repeat { item, min, max } => self.repeat(item, *min, *max, from, to)?,
        }
        Some(())
    }

    fn literal(&mut self, s: &str, from: u32, to: u32) -> Option<()> {
        let mut cur = from;
        let mut chars = s.chars().peekable();
        while let Some(c) = chars.next() {
            let next = if chars.peek().is_none() {
                to
            } else {
                self.state()?
            };
            self.edge(cur, CharSet::single(c), next);
            cur = next;
        }
        Some(())
    }

    fn repeat(
        &mut self,
        item: &Expr,
        min: u32,
        max: Option<u32>,
        from: u32,
        to: u32,
    ) -> Option<()> {
        let mut cur = from;
        for _ in 0..min {
            let next = self.state()?;
            self.wire(item, cur, next)?;
            cur = next;
        }
        match max {
            None => {
                let lp = self.state()?;
                self.eps(cur, lp);
                self.wire(item, lp, lp)?;
                self.eps(lp, to);
            }
            Some(max) => {
                for _ in min..max {
                    let next = self.state()?;
                    self.eps(cur, to);
                    self.wire(item, cur, next)?;
                    cur = next;
                }
                self.eps(cur, to);
            }
        }
        Some(())
    }
}

/// Whether some non-empty string `w` of `a`, followed by a character of
/// `follow`, is the beginning of a string of `b`. `budget` bounds the
/// pairs of states visited (it is decreased by those visited); `None`
/// when it runs out.
pub(super) fn extends_into(a: &Nfa, follow: &CharSet, b: &Nfa, budget: &mut usize) -> Option<bool> {
    product(a, b, budget, |sa, sb, live_b| {
        sa == a.accept
            && b.edges[sb as usize]
                .iter()
                .any(|(set, t)| live_b[*t as usize] && set.intersects(follow))
    })
}

/// Whether `a` and `b` share a non-empty string (bounded as
/// [`extends_into`]).
pub(super) fn share_a_string(a: &Nfa, b: &Nfa, budget: &mut usize) -> Option<bool> {
    product(a, b, budget, |sa, sb, _| sa == a.accept && sb == b.accept)
}

/// Walks the pairs of states `a` and `b` reach on the same non-empty
/// strings (`b` only through states that can still accept) until `goal`
/// holds for one: `goal(state of a, state of b, which states of b can
/// still accept)`.
fn product(
    a: &Nfa,
    b: &Nfa,
    budget: &mut usize,
    goal: impl Fn(u32, u32, &[bool]) -> bool,
) -> Option<bool> {
    let live_b = b.coreachable();
    let start = (a.start, b.start, false);
    let mut seen = HashSet::from([start]);
    let mut stack = vec![start];
    while let Some((sa, sb, nonempty)) = stack.pop() {
        *budget = budget.checked_sub(1)?;
        if nonempty && goal(sa, sb, &live_b) {
            return Some(true);
        }
        let mut push = |s: (u32, u32, bool)| {
            if seen.insert(s) {
                stack.push(s);
            }
        };
        for &ta in &a.eps[sa as usize] {
            push((ta, sb, nonempty));
        }
        for &tb in &b.eps[sb as usize] {
            push((sa, tb, nonempty));
        }
        for (set_a, ta) in &a.edges[sa as usize] {
            for (set_b, tb) in &b.edges[sb as usize] {
                if live_b[*tb as usize] && set_a.intersects(set_b) {
                    push((*ta, *tb, true));
                }
            }
        }
    }
    Some(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lit(s: &str) -> Expr {
        Expr::Literal(s.to_string())
    }

    fn class(s: &str) -> Expr {
        let ranges = s.chars().map(|c| (c as u32, c as u32)).collect();
        Expr::Class {
            negated: false,
            set: CharSet::from_ranges(ranges),
        }
    }

    fn plus(e: Expr) -> Expr {
        Expr::Repeat {
            item: Box::new(e),
            min: 1,
            max: None,
        }
    }

    fn extends(a: &Expr, follow: char, b: &Expr) -> bool {
        let (na, nb) = (Nfa::of(a, &[]).unwrap(), Nfa::of(b, &[]).unwrap());
        extends_into(&na, &CharSet::single(follow), &nb, &mut 10_000).unwrap()
    }

    #[test]
    fn a_match_followed_by_a_char_that_continues_it() {
        let word = plus(class("ab"));
        assert!(extends(&word, 'a', &word));
        assert!(!extends(&word, ' ', &word));
        assert!(extends(&lit("a"), 'b', &lit("abc")));
        assert!(!extends(&lit("a"), 'c', &lit("abc")));
        // "abc" followed by anything is longer than "abc".
        assert!(!extends(&lit("abc"), 'd', &lit("abc")));
    }

    #[test]
    fn shared_strings() {
        let share = |a: &Expr, b: &Expr| {
            let (na, nb) = (Nfa::of(a, &[]).unwrap(), Nfa::of(b, &[]).unwrap());
            share_a_string(&na, &nb, &mut 10_000).unwrap()
        };
        assert!(share(&plus(class("ab")), &lit("ba")));
        assert!(!share(&plus(class("ab")), &lit("bc")));
        assert!(!share(&lit("ab"), &lit("abc")));
        let opt = Expr::Repeat {
            item: Box::new(lit("x")),
            min: 0,
            max: Some(1),
        };
        assert!(!share(&opt, &Expr::Empty));
    }

    #[test]
    fn the_empty_match_does_not_count() {
        let opt = Expr::Repeat {
            item: Box::new(lit("x")),
            min: 0,
            max: Some(1),
        };
        assert!(!extends(&opt, 'a', &lit("ab")));
        assert!(extends(&opt, 'y', &lit("xy")));
    }

    #[test]
    fn bounded_repeats_and_budgets() {
        let three = Expr::Repeat {
            item: Box::new(class("a")),
            min: 1,
            max: Some(3),
        };
        assert!(extends(&three, 'a', &three));
        let exactly = Expr::Repeat {
            item: Box::new(class("a")),
            min: 3,
            max: Some(3),
        };
        assert!(!extends(&exactly, 'a', &exactly));
        let huge = Expr::Repeat {
            item: Box::new(class("a")),
            min: 100_000,
            max: None,
        };
        assert!(Nfa::of(&huge, &[]).is_none());
        let (na, nb) = (Nfa::of(&three, &[]).unwrap(), Nfa::of(&three, &[]).unwrap());
        assert_eq!(extends_into(&na, &CharSet::single('a'), &nb, &mut 2), None);
    }
}
