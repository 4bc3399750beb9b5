//! The suite's own rule about time (`common/alone.rs`): a test in a module named `alone` (a
//! `mod alone { ... }` at the end of its suite, or the file `SUITE/alone.rs`) measures alone, by calling `measure_alone()` itself or through a helper it
//! calls. One that did not would run beside other tests of its pass while it measures, as if the
//! module did not exist. (The other way round, `measure_alone()` outside such a module, fails the
//! test that calls it.)

use std::collections::BTreeMap;
use std::path::Path;

/// Every `.rs` file of the suite, with its text.
fn sources() -> Vec<(String, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/suite");
    crate::common::files_under(&dir)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .map(|p| {
            (
                p.display().to_string(),
                std::fs::read_to_string(&p).unwrap(),
            )
        })
        .collect()
}

/// The text from `open` (a `{`) to its matching `}`, braces in string and character literals
/// left out.
fn block(text: &str, open: usize) -> &str {
    let bytes = text.as_bytes();
    let (mut depth, mut in_str, mut escaped, mut skip) = (0, false, false, 0);
    for (i, c) in text[open..].char_indices() {
        let at = open + i;
        if skip > 0 {
            skip -= 1;
            continue;
        }
        match (in_str, escaped, c) {
            (true, true, _) => escaped = false,
            (true, false, '\\') => escaped = true,
            (_, false, '"') => in_str = !in_str,
            // '{', '"' and '\'' are characters, not braces or quotes.
            (false, _, '\'') if bytes.get(at + 2) == Some(&b'\'') => skip = 2,
            (false, _, '\'') if bytes.get(at + 1) == Some(&b'\\') => skip = 3,
            (false, _, '{') => depth += 1,
            (false, _, '}') => {
                depth -= 1;
                if depth == 0 {
                    return &text[open..=at];
                }
            }
            _ => {}
        }
    }
    panic!("no end to the block at {open}")
}

/// Every function's body, by name, in `text`.
fn bodies(text: &str) -> Vec<(String, &str)> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(found) = text[at..].find("fn ") {
        let start = at + found + 3;
        at = start;
        let name: String = text[start..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let Some(open) = text[start..].find('{').map(|o| start + o) else {
            break;
        };
        if name.is_empty() || text[start..open].contains(';') {
            continue;
        }
        out.push((name, block(text, open)));
    }
    out
}

#[test]
fn every_test_in_alone_measures_alone() {
    let files = sources();
    let all: BTreeMap<String, String> = files
        .iter()
        .flat_map(|(_, text)| bodies(text))
        .map(|(name, body)| (name, body.to_string()))
        .collect();
    let measures = |body: &str| body.contains("measure_alone");
    let mut tests = 0;
    let mut bad = Vec::new();
    for (path, text) in &files {
        if path.contains("/common/") {
            continue;
        }
        let text: &str = if path.ends_with("/alone.rs") {
            text
        } else if let Some(at) = text.find("\nmod alone {") {
            block(text, at + "\nmod alone ".len())
        } else {
            continue;
        };
        let tests_here = bodies(text).into_iter().filter(|(name, _)| {
            text.contains(&format!("#[test]\nfn {name}("))
                || text.contains(&format!("#[test]\n    fn {name}("))
        });
        for (name, body) in tests_here {
            let helpers = all
                .iter()
                .filter(|(helper, _)| body.contains(&format!("{helper}(")));
            tests += 1;
            if !measures(body) && !helpers.clone().any(|(_, b)| measures(b)) {
                bad.push(format!("{path}: {name}"));
            }
        }
    }
    assert!(tests >= 30, "found only {tests} tests in alone modules");
    assert!(
        bad.is_empty(),
        "in `alone` without measure_alone(): {bad:?}"
    );
}
