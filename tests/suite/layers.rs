//! The house stays the way ARCHITECTURE.md draws it: no import cycle between files of `src/`, and
//! no wing reaching sideways (rust-analyzer keeps such "tidy" tests in `xtask/src/tidy.rs`). The
//! edges are read from the source text: every `crate::a::b` path and every `super::` path in code
//! (not comments, not unit tests), resolved to the file of the longest module path that exists.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every module of `src/` (as `a::b`; the crate root is ``) and its source, unit tests left out.
fn modules() -> BTreeMap<String, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = BTreeMap::new();
    for path in crate::common::files_under(&root) {
        if path.extension().is_none_or(|e| e != "rs") || path.ends_with("main.rs") {
            continue;
        }
        let rel: PathBuf = path.strip_prefix(&root).unwrap().with_extension("");
        let mut parts: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
            parts.pop();
        }
        let text = std::fs::read_to_string(&path).unwrap();
        // Code only: comments name modules too (doc links), and unit tests may reach anywhere.
        let code: String = text
            .split("#[cfg(test)]")
            .next()
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .map(|l| format!("{l}\n"))
            .collect();
        out.insert(parts.join("::"), code);
    }
    out
}

/// The modules `module`'s code refers to (itself left out).
fn edges(module: &str, code: &str, all: &BTreeMap<String, String>) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let resolve = |path: Vec<&str>, found: &mut BTreeSet<String>| {
        for n in (1..=path.len()).rev() {
            let candidate = path[..n].join("::");
            if all.contains_key(&candidate) {
                if candidate != module {
                    found.insert(candidate);
                }
                return;
            }
        }
    };
    for (i, _) in code.match_indices("crate::") {
        for w in paths(&code[i + "crate::".len()..]) {
            resolve(w.iter().map(String::as_str).collect(), &mut found);
        }
    }
    // `super::x` from `a::b` (a file) is `a::x`; from `a` (a mod.rs) it is `x`.
    for (i, _) in code.match_indices("super::") {
        if code[..i].ends_with("super::") {
            continue;
        }
        let mut base: Vec<&str> = module.split("::").filter(|p| !p.is_empty()).collect();
        let mut rest = &code[i..];
        while let Some(r) = rest.strip_prefix("super::") {
            base.pop();
            rest = r;
        }
        for w in paths(rest) {
            let mut path = base.clone();
            path.extend(w.iter().map(String::as_str));
            resolve(path, &mut found);
        }
    }
    found
}

/// The module paths named at the start of `rest` (what follows `crate::` or `super::`): one, or
/// one per item of a `{a, b::c, self}` group (nested groups too).
fn paths(rest: &str) -> Vec<Vec<String>> {
    let end = rest
        .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(rest.len());
    let head = &rest[..end];
    let prefix: Vec<String> = head
        .split("::")
        .filter(|w| !w.is_empty())
        .map(str::to_string)
        .collect();
    if !(head.is_empty() || head.ends_with("::")) || !rest[end..].starts_with('{') {
        return vec![prefix];
    }
    // The group's items, split at its own commas.
    let inside = &rest[end + 1..];
    let (mut depth, mut start, mut out) = (0, 0, Vec::new());
    for (i, c) in inside.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                out.extend(item_paths(&prefix, &inside[start..i]));
                return out;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.extend(item_paths(&prefix, &inside[start..i]));
                start = i + 1;
            }
            _ => {}
        }
    }
    out
}

/// One item of a group, under its prefix (`self` is the prefix itself).
fn item_paths(prefix: &[String], item: &str) -> Vec<Vec<String>> {
    let item = item.trim();
    if item == "self" || item.starts_with("self ") {
        return vec![prefix.to_vec()];
    }
    paths(item)
        .into_iter()
        .map(|p| prefix.iter().cloned().chain(p).collect())
        .collect()
}

/// A cycle through `start`, if any (depth-first).
fn cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = stack.iter().position(|n| n == node) {
            let mut c = stack[at..].to_vec();
            c.push(node.to_string());
            return Some(c);
        }
        if done.contains(node) {
            return None;
        }
        stack.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(c) = visit(next, graph, stack, done) {
                return Some(c);
            }
        }
        stack.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for node in graph.keys() {
        if let Some(c) = visit(node, graph, &mut Vec::new(), &mut done) {
            return Some(c);
        }
    }
    None
}

/// The module graph, without the crate root (`lib.rs` declares and orchestrates everything).
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let all = modules();
    let mut g = BTreeMap::new();
    for (module, code) in &all {
        if module.is_empty() {
            continue;
        }
        let mut e = edges(module, code, &all);
        e.retain(|to| !to.is_empty());
        g.insert(module.clone(), e);
    }
    g
}

#[test]
fn no_import_cycle_between_files() {
    let g = graph();
    assert!(g.len() > 30, "the source was not read: {g:?}");
    if let Some(c) = cycle(&g) {
        panic!("an import cycle: {}", c.join(" -> "));
    }
}

/// The layers ARCHITECTURE.md draws, lowest first. A file may import a lower layer, or files of
/// its own wing (the base modules share one); `store/` and `command/` are one layer, neither above
/// the other. Every module of `src/` must be placed here, so a new one is placed on purpose.
fn layer(module: &str) -> Option<(u8, &str)> {
    let wing = module.split("::").next().unwrap_or_default();
    let rank = match wing {
        "clock" | "duration" | "files" | "hooks" | "host" | "log" | "exit" | "memory"
        | "signals" => 0,
        "lease" | "record" => 1,
        "store" | "command" => 2,
        "fleet" | "handover" => 3,
        "config" | "watchdog" => 4,
        "http" | "starting" => 5,
        "run" | "replica" => 6,
        "cli" => 7,
        _ => return None,
    };
    Some((rank, if rank == 0 { "base" } else { wing }))
}

/// ARCHITECTURE.md's rules: `store/` never starts or stops a process and knows nothing above it;
/// `command/` never talks to Redis; the lease knows neither; nothing below `lib.rs` and `cli/` sees
/// the command line.
#[test]
fn no_wing_reaches_sideways() {
    let g = graph();
    let mut wrong = Vec::new();
    for (from, tos) in &g {
        let Some((rank, wing)) = layer(from) else {
            wrong.push(format!("{from} is in no layer of tests/suite/layers.rs"));
            continue;
        };
        for to in tos {
            // The fleet reports on runs and reads the store; it never touches the command.
            let sideways = wing == "fleet" && to.starts_with("command");
            let ok = !sideways && layer(to).is_some_and(|(r, w)| r < rank || w == wing);
            if !ok {
                wrong.push(format!("{from} -> {to}"));
            }
        }
    }
    assert!(wrong.is_empty(), "against the layering: {wrong:#?}");
}

/// The command line is resolved once, in `cli/`, into `config::RunConfig` (or an admin request):
/// no file below `lib.rs` and `cli/` names `Cli`, so a run described another way starts the same.
#[test]
fn only_lib_and_cli_see_the_command_line() {
    let mut seen = Vec::new();
    for (module, code) in modules() {
        if module.is_empty() || module == "cli" || module.starts_with("cli::") {
            continue;
        }
        let names_cli = code.match_indices("Cli").any(|(i, _)| {
            let before = code[..i].chars().next_back();
            let after = code[i + 3..].chars().next();
            let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
            !word(before) && !word(after)
        });
        if names_cli {
            seen.push(module);
        }
    }
    assert!(seen.is_empty(), "these name Cli: {seen:?}");
}

/// Records are read through their types (`src/record/`): no file outside it reads a JSON value by
/// a field's name (`v["state"].as_str()`, `v["held"] == true`), so a field renamed in a script and
/// its type cannot leave a reader behind. Writing an output document by name is fine.
#[test]
fn records_are_read_only_through_their_types() {
    let mut wrong = Vec::new();
    for (module, code) in modules() {
        if module == "record" || module.starts_with("record::") {
            continue;
        }
        for (n, line) in code.lines().enumerate() {
            let Some(at) = line.find("[\"") else {
                continue;
            };
            let Some(end) = line[at + 2..].find("\"]") else {
                continue;
            };
            let after = line[at + 2 + end + 2..].trim_start();
            let reads = after.starts_with(".as_")
                || after.starts_with(".get(")
                || after.starts_with("==")
                || after.starts_with("!=");
            if reads {
                wrong.push(format!("{module}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(wrong.is_empty(), "records read by field name: {wrong:#?}");
}

/// One meaning per name, types included: no two types, traits or aliases of `src/` share a name
/// (ARCHITECTURE.md's "Names"), those declared inside a function included.
#[test]
fn no_two_types_share_a_name() {
    let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (module, code) in modules() {
        for raw in code.lines() {
            let line = raw.trim_start();
            // An indented `type` is a trait's associated type (`type Output = ...`), not a name.
            if raw.len() != line.len() && line.starts_with("type ") {
                continue;
            }
            let item = line
                .strip_prefix("pub ")
                .or_else(|| line.strip_prefix("pub(crate) "))
                .or_else(|| line.strip_prefix("pub(super) "))
                .unwrap_or(line);
            let Some(rest) = ["struct ", "enum ", "type ", "trait "]
                .iter()
                .find_map(|k| item.strip_prefix(k))
            else {
                continue;
            };
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if name.starts_with(|c: char| c.is_ascii_uppercase()) {
                seen.entry(name).or_default().push(module.clone());
            }
        }
    }
    let shared: Vec<String> = seen
        .into_iter()
        .filter(|(_, m)| m.len() > 1)
        .map(|(n, m)| format!("{n}: {}", m.join(", ")))
        .collect();
    assert!(shared.is_empty(), "types that share a name: {shared:#?}");
}

/// No parameters packed into a tuple (`(exit, ending): (Exit, Ending)`) to get past a lint on
/// their count: a parameter list that is a concept is a struct, any other is a list.
#[test]
fn no_parameters_are_packed_into_tuples() {
    let mut wrong = Vec::new();
    for (module, code) in modules() {
        for (n, line) in code.lines().enumerate() {
            let t = line.trim_start();
            // `(a, b): (A, B)` as a parameter: on a line of its own, or inside a `fn` line.
            let parts: Vec<&str> = t.split("): (").collect();
            let packed = parts[..parts.len() - 1].iter().any(|left| {
                let Some(open) = left.rfind('(') else {
                    return false;
                };
                let names = &left[open + 1..];
                let before = left[..open].chars().last();
                let at_start = open == 0 && t.starts_with('(');
                let in_fn = t.contains("fn ") && matches!(before, Some('(') | Some(' '));
                names.contains(", ")
                    && (at_start || in_fn)
                    && names.split(", ").all(|n| {
                        !n.is_empty() && n.chars().all(|c| c.is_ascii_lowercase() || c == '_')
                    })
            });
            if packed {
                wrong.push(format!("{module}:{}: {t}", n + 1));
            }
        }
    }
    assert!(wrong.is_empty(), "tuple-packed parameters: {wrong:#?}");
}

/// Test hooks have one idiom: only `src/hooks.rs` names a `CRONLOCK_TEST_*` variable or asks
/// whether this is a debug build; everything else reads a hook through it.
#[test]
fn test_hooks_are_read_in_one_place() {
    let mut elsewhere = Vec::new();
    for (module, code) in modules() {
        if module == "hooks" {
            continue;
        }
        if code.contains("CRONLOCK_TEST_") || code.contains("debug_assertions") {
            elsewhere.push(module);
        }
    }
    assert!(
        elsewhere.is_empty(),
        "test hooks read outside src/hooks.rs: {elsewhere:?}"
    );
}

/// The tuples in a type's text: `(A, B)` groups with a comma at their own depth, not a closure's
/// parameters (`Fn(A, B)`) nor the unit `()`.
fn tuples_in(ty: &str) -> Vec<String> {
    let mut found = Vec::new();
    let bytes: Vec<char> = ty.chars().collect();
    for (i, &c) in bytes.iter().enumerate() {
        if c != '(' {
            continue;
        }
        let before: String = bytes[..i].iter().collect();
        if before.trim_end().ends_with("Fn")
            || before.trim_end().ends_with("FnMut")
            || before.trim_end().ends_with("FnOnce")
        {
            continue;
        }
        let mut depth = 0;
        let mut comma = false;
        for (j, &d) in bytes.iter().enumerate().skip(i) {
            match d {
                '(' | '<' | '[' => depth += 1,
                ')' | '>' | ']' => {
                    depth -= 1;
                    if depth == 0 {
                        if comma {
                            found.push(bytes[i..=j].iter().collect());
                        }
                        break;
                    }
                }
                ',' if depth == 1 => comma = true,
                _ => {}
            }
        }
    }
    found
}

/// No results, variants or aliases shaped as tuples: what a function returns, an enum variant
/// carries or an alias stands for, with several parts, names them (a struct, or a variant's
/// fields), as parameters do
/// (`no_parameters_are_packed_into_tuples`). `Option<(Duration, String)>` and
/// `Busy(Option<Duration>, String, Option<i64>)` read as puzzles at every use.
#[test]
fn no_results_or_variants_are_tuples() {
    let mut wrong = Vec::new();
    for (module, code) in modules() {
        // Return types: from `->` to the body, `where` or the end of a declaration.
        for (at, _) in code.match_indices("->") {
            let rest = &code[at + 2..];
            let end = rest
                .find(['{', ';'])
                .unwrap_or(rest.len())
                .min(rest.find(" where").unwrap_or(usize::MAX));
            let ty = rest[..end].split('=').next().unwrap_or_default();
            if !tuples_in(ty).is_empty() {
                wrong.push(format!("{module}: -> {}", ty.trim()));
            }
        }
        // Aliases that name a tuple (`type Parts = (Addr, bool, ...)`): a struct, unnamed.
        let mut at = 0;
        while let Some(found) = code[at..].find("type ") {
            let start = at + found;
            at = start + 5;
            let line_start = code[..start].rfind('\n').map_or(0, |n| n + 1);
            let before = code[line_start..start].trim();
            let item = before.is_empty() || before == "pub" || before.starts_with("pub(");
            let Some(len) = code[start..].find(';') else {
                break;
            };
            let alias = &code[start + 5..start + len];
            if let (true, Some((name, ty))) = (item, alias.split_once('=')) {
                if !tuples_in(ty).is_empty() {
                    wrong.push(format!("{module}: type {}", name.trim()));
                }
            }
        }
        // Variants with several unnamed fields: `Name(A, B),` inside an enum.
        let mut in_enum = false;
        for line in code.lines() {
            let t = line.trim();
            if t.starts_with("pub enum ") || t.starts_with("enum ") || t.contains(" enum ") {
                in_enum = true;
                continue;
            }
            if in_enum && line.starts_with('}') {
                in_enum = false;
            }
            if !in_enum || !t.starts_with(|c: char| c.is_ascii_uppercase()) {
                continue;
            }
            if let Some(open) = t.find('(') {
                if !t[..open].contains(|c: char| !c.is_alphanumeric()) {
                    if let Some(fields) = tuples_in(&t[open..]).first() {
                        wrong.push(format!("{module}: {}{fields}", &t[..open]));
                    }
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "tuples as results or variants: {wrong:#?}"
    );
}
