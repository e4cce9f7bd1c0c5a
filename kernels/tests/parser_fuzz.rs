//! The parser and verifier never panic: random text, and real kernels' text mutated at random,
//! give either a function or a typed error.

mod common;

use proptest::prelude::*;
use std::sync::OnceLock;
use trident_core::{text, verify};

fn corpus() -> &'static Vec<String> {
    static C: OnceLock<Vec<String>> = OnceLock::new();
    C.get_or_init(|| common::all_kernels().iter().map(text::print).collect())
}

/// Parses, and when that succeeds verifies and prints: none of it may panic.
fn exercise(src: &str) {
    if let Ok(f) = text::parse(src) {
        if verify(&f).is_ok() {
            let again = text::print(&f);
            let reparsed = text::parse(&again).expect("printed IR of a verified kernel parses");
            assert_eq!(text::print(&reparsed), again);
        }
    }
}

#[derive(Debug, Clone)]
enum Mutation {
    Delete { at: usize, len: usize },
    Insert { at: usize, text: String },
    SwapLines { a: usize, b: usize },
    DuplicateLine { at: usize },
    Truncate { at: usize },
    ReplaceWord { nth: usize, with: String },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let words = prop::sample::select(vec![
        "%0",
        "%1",
        "%x",
        "tile<3xf32>",
        "tile<64x!ptr<f32>>",
        "f16",
        "i1",
        "!token",
        "yield",
        "}",
        "{",
        ",",
        "for",
        "if",
        "while",
        "do",
        "-1",
        "99999999999",
        "nan",
        "axis",
        "mask",
        "dot",
        "load",
        "store",
        "=",
        ":",
        "(",
        ")",
        "[",
        "]",
        "cmp",
        "x",
        "@",
        "//",
        "\n",
        "é",
        "-inf",
        "1e400",
        "return",
    ]);
    prop_oneof![
        (any::<usize>(), 1usize..40).prop_map(|(at, len)| Mutation::Delete { at, len }),
        (any::<usize>(), words.clone()).prop_map(|(at, w)| Mutation::Insert { at, text: w.to_string() }),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Mutation::SwapLines { a, b }),
        any::<usize>().prop_map(|at| Mutation::DuplicateLine { at }),
        any::<usize>().prop_map(|at| Mutation::Truncate { at }),
        (any::<usize>(), words).prop_map(|(nth, w)| Mutation::ReplaceWord { nth, with: w.to_string() }),
    ]
}

fn apply(src: &str, m: &Mutation) -> String {
    let chars: Vec<char> = src.chars().collect();
    let n = chars.len().max(1);
    let lines: Vec<&str> = src.lines().collect();
    match m {
        Mutation::Delete { at, len } => {
            let a = at % n;
            let b = (a + len).min(chars.len());
            chars[..a].iter().chain(&chars[b..]).collect()
        }
        Mutation::Insert { at, text } => {
            let a = at % n;
            let mut s: String = chars[..a.min(chars.len())].iter().collect();
            s.push_str(text);
            s.extend(&chars[a.min(chars.len())..]);
            s
        }
        Mutation::SwapLines { a, b } => {
            let mut l = lines.clone();
            let (a, b) = (a % l.len().max(1), b % l.len().max(1));
            if !l.is_empty() {
                l.swap(a, b);
            }
            l.join("\n")
        }
        Mutation::DuplicateLine { at } => {
            let mut l = lines.clone();
            if !l.is_empty() {
                let i = at % l.len();
                l.insert(i, lines[i]);
            }
            l.join("\n")
        }
        Mutation::Truncate { at } => chars[..at % n].iter().collect(),
        Mutation::ReplaceWord { nth, with } => {
            let words: Vec<&str> = src.split(' ').collect();
            let i = nth % words.len().max(1);
            words.iter().enumerate().map(|(j, w)| if j == i { with.as_str() } else { w }).collect::<Vec<_>>().join(" ")
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn random_text_never_panics(s in "\\PC{0,200}") {
        exercise(&s);
    }

    #[test]
    fn random_ir_shaped_text_never_panics(s in "(kernel @k\\(%a: !ptr<f32>\\) \\{\n)?([%0-9a-z_=:,<>!(){}\\[\\] \n.-]{0,120})(return\n\\})?") {
        exercise(&s);
    }

    #[test]
    fn mutated_kernels_never_panic(which in any::<usize>(), muts in prop::collection::vec(mutation(), 1..4)) {
        let c = corpus();
        let mut src = c[which % c.len()].clone();
        for m in &muts {
            src = apply(&src, m);
        }
        exercise(&src);
    }
}
