use super::*;

/// `source` rendered by plain minijinja, as written and as rewritten.
fn both(source: &str) -> (String, String) {
    let ctx = minijinja::context! {
        messages => vec![minijinja::context! { role => "user", content => "hi" }],
    };
    let plain = Environment::new()
        .render_str(source, ctx.clone())
        .expect("renders as written");
    let mut env = Environment::new();
    env.add_function(GROW_FUNCTION, grow);
    let _budget = bound::Budget::enter(1 << 20);
    let _grown = Grown::enter();
    let rewritten = env
        .render_str(&bound_operators(source), ctx)
        .expect("renders rewritten");
    (plain, rewritten)
}

#[test]
fn rewritten_operators_give_minijinja_s_own_values() {
    let cases = [
        "{{ 1 + 2 }}|{{ 1.5 + 2 }}|{{ 'a' ~ 3 }}|{{ [1] + [2, 3] }}",
        "{{ 'ab' * 3 }}|{{ 3 * 'ab' }}|{{ 2 * 2.5 }}|{{ ([1] * 2) | length }}",
        "{% for m in messages %}{{ loop.index0 + 1 }}:{{ m.role ~ '/' + m.content }}{% endfor %}",
        "{{ messages[0].content * 2 }}|{{ {'k': 'a' ~ 'b' ~ messages[0].role} }}",
        "{{ (messages[0].content ~ 'x') | upper ~ 'y' if messages else 'n' }}",
        "{{ [messages[0].role + '1', 2 + 3][0:1] }}|{{ messages[0]['con' ~ 'tent'] }}",
        "{% set ns = namespace(s='') %}{% for m in messages %}{% set ns.s = ns.s + m.content + '\n' %}{% endfor %}{{ ns.s }}",
        "{% macro f(x, y='d' ~ 'e') %}{{ x ~ y }}{% endmacro %}{{ f('a' ~ messages[0].role) }}",
        "{{ range(3) | map('string') | join('-' ~ '+') }}|{{ 1 + 2 is odd }}|{{ not (1 + 1 == 2) }}",
    ];
    for source in cases {
        let (plain, rewritten) = both(source);
        assert_eq!(plain, rewritten, "{source}");
    }
}

#[test]
fn operators_are_routed_through_the_function_on_the_same_lines() {
    let source = "{{ a ~ b }}\n{% set x = (a + 1) * c %}\n{{ 'k' ~ 'v' }}{{ f(a ~ b)|upper }}";
    let out = bound_operators(source);
    assert_eq!(
        out,
        "{{ __moestream_grow(\"~\", a, b) }}\n\
         {% set x = __moestream_grow(\"*\", __moestream_grow(\"+\", a, 1), c) %}\n\
         {{ 'k' ~ 'v' }}{{ f(__moestream_grow(\"~\", a, b))|upper }}"
    );
    assert_eq!(out.lines().count(), source.lines().count());
}

#[test]
fn a_result_over_the_bound_is_refused_before_it_is_built() {
    let _budget = bound::Budget::enter(1000);
    let _grown = Grown::enter();
    let err = grow("*", Value::from("ab"), Value::from(10_000)).unwrap_err();
    assert!(err.to_string().contains("memory bound"), "{err}");
    let err = grow(
        "~",
        Value::from("a".repeat(600)),
        Value::from("b".repeat(600)),
    )
    .unwrap_err();
    assert!(err.to_string().contains("memory bound"), "{err}");
}

#[test]
fn the_operators_sum_is_bounded_too() {
    let _budget = bound::Budget::enter(1000);
    let _grown = Grown::enter();
    let s = Value::from("x".repeat(300));
    let mut refused = None;
    for i in 0..100 {
        if let Err(e) = grow("~", s.clone(), Value::from("")) {
            refused = Some((i, e));
            break;
        }
    }
    let (i, err) = refused.expect("refused within the sum bound");
    // 316 bytes a call (two strings of 8 + their bytes).
    assert_eq!(i, GROWN_PER_BOUND * 1000 / 316, "{err}");
    assert!(err.to_string().contains("in all"), "{err}");
}
