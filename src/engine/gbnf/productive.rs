//! Rules that can finish: a rule is *productive* when it matches some
//! finite string. Alternatives through unproductive rules match nothing,
//! so dropping them keeps the language; keeping them would let the
//! parser allow a prefix that nothing can complete (a dead end in the
//! middle of generation).

use super::ast::{Expr, Rule};

/// Drops every alternative of `rules` that can never finish; returns
/// which rules are productive (the bodies of the others are unchanged).
pub(super) fn prune(rules: &mut [Rule]) -> Vec<bool> {
    let productive = productive_rules(rules);
    for (rule, &ok) in rules.iter_mut().zip(&productive) {
        if ok {
            let body = std::mem::replace(&mut rule.body, Expr::Empty);
            rule.body = pruned(body, &productive).unwrap_or(Expr::Empty);
        }
    }
    productive
}

/// Which rules match some finite string (a worklist: a rule is checked
/// again when a rule it names becomes productive).
fn productive_rules(rules: &[Rule]) -> Vec<bool> {
    let n = rules.len();
    let mut users = vec![Vec::new(); n];
    for (r, rule) in rules.iter().enumerate() {
        for_each_ref(&rule.body, &mut |x| users[x].push(r));
    }
    let mut productive = vec![false; n];
    let mut queue: Vec<usize> = (0..n).collect();
    while let Some(r) = queue.pop() {
        if productive[r] || !finishes(&rules[r].body, &productive) {
            continue;
        }
        productive[r] = true;
        queue.extend(users[r].iter().copied().filter(|&u| !productive[u]));
    }
    productive
}

fn for_each_ref(e: &Expr, f: &mut impl FnMut(usize)) {
    match e {
        Expr::Ref(r) => f(*r),
        Expr::Seq(v) | Expr::Alt(v) => v.iter().for_each(|x| for_each_ref(x, f)),
        Expr::Repeat { item, .. } => for_each_ref(item, f),
        Expr::Empty | Expr::Literal(_) | Expr::Class { .. } => {}
    }
}

/// Whether `e` matches some finite string, given which rules do.
fn finishes(e: &Expr, productive: &[bool]) -> bool {
    match e {
        Expr::Empty | Expr::Literal(_) | Expr::Class { .. } => true,
        Expr::Ref(r) => productive[*r],
        Expr::Seq(v) => v.iter().all(|x| finishes(x, productive)),
        Expr::Alt(v) => v.iter().any(|x| finishes(x, productive)),
        Expr::Repeat { item, min, .. } => *min == 0 || finishes(item, productive),
    }
}

/// `e` without its alternatives that never finish; `None` when nothing
/// is left.
fn pruned(e: Expr, productive: &[bool]) -> Option<Expr> {
    match e {
        Expr::Ref(r) => productive[r].then_some(Expr::Ref(r)),
        Expr::Seq(v) => {
            let items: Option<Vec<Expr>> = v.into_iter().map(|x| pruned(x, productive)).collect();
            items.map(Expr::seq)
        }
        Expr::Alt(v) => {
            let alts: Vec<Expr> = v
                .into_iter()
                .filter_map(|x| pruned(x, productive))
                .collect();
            (!alts.is_empty()).then(|| Expr::alt(alts))
        }
        Expr::Repeat { item, min, max } => match pruned(*item, productive) {
            Some(item) => Some(Expr::repeat(item, min, max)),
            None => (min == 0).then_some(Expr::Empty),
        },
        leaf => Some(leaf),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(name: &str, body: Expr) -> Rule {
        Rule {
            name: name.to_string(),
            body,
        }
    }

    #[test]
    fn alternatives_that_never_finish_are_dropped() {
        let a = Expr::Literal("a".to_string());
        let mut rules = vec![
            // root ::= "a" | loop | "a" loop*
            rule(
                "root",
                Expr::Alt(vec![
                    a.clone(),
                    Expr::Ref(1),
                    Expr::Seq(vec![
                        a.clone(),
                        Expr::Repeat {
                            item: Box::new(Expr::Ref(1)),
                            min: 0,
                            max: None,
                        },
                    ]),
                ]),
            ),
            // loop ::= "c" loop
            rule(
                "loop",
                Expr::Seq(vec![Expr::Literal("c".to_string()), Expr::Ref(1)]),
            ),
        ];
        assert_eq!(prune(&mut rules), vec![true, false]);
        let want = Expr::Alt(vec![a.clone(), a]);
        assert_eq!(rules[0].body, want);
    }
}
