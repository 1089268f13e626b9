//! The parsed grammar: expressions, named rules and the grammar with its
//! `root`, shared by the parser ([`super::parse`]) and the passes after it
//! (productivity, lexeme planning, emission).

use super::charset::CharSet;

/// One expression of a rule body.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) enum Expr {
    /// The empty string.
    Empty,
    /// An exact, non-empty string.
    Literal(String),
    /// One code point of `set` (or, when `negated`, one not in it); `.`
    /// is a negated empty set.
    Class {
        negated: bool,
        set: CharSet,
    },
    /// Another rule, by index.
    Ref(usize),
    Seq(Vec<Expr>),
    Alt(Vec<Expr>),
    /// `item` `min` to `max` times (`None`: unbounded).
    Repeat {
        item: Box<Expr>,
        min: u32,
        max: Option<u32>,
    },
}

impl Expr {
    /// The code points a class matches.
    pub(super) fn class_chars(negated: bool, set: &CharSet) -> CharSet {
        if negated {
            set.complement()
        } else {
            set.clone()
        }
    }

    pub(super) fn seq(mut items: Vec<Expr>) -> Expr {
        items.retain(|e| *e != Expr::Empty);
        match items.len() {
            0 => Expr::Empty,
            1 => items.remove(0),
            _ => Expr::Seq(items),
        }
    }

    pub(super) fn alt(mut alts: Vec<Expr>) -> Expr {
        if alts.len() == 1 {
            alts.remove(0)
        } else {
            Expr::Alt(alts)
        }
    }

    pub(super) fn repeat(item: Expr, min: u32, max: Option<u32>) -> Expr {
        match (min, max) {
            _ if item == Expr::Empty || max == Some(0) => Expr::Empty,
            (1, Some(1)) => item,
            _ => Expr::Repeat {
                item: Box::new(item),
                min,
                max,
            },
        }
    }
}

/// A named rule.
#[derive(Debug)]
pub(super) struct Rule {
    pub name: String,
    pub body: Expr,
}

/// A parsed grammar: its rules and which one is `root`.
#[derive(Debug)]
pub(super) struct Grammar {
    pub rules: Vec<Rule>,
    pub root: usize,
}
