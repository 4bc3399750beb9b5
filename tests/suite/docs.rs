//! `completions/` and `man/cronlock.1` are generated from the clap definition and checked in.
//! This test regenerates them and fails when the checked-in files differ.
//! Run with `CRONLOCK_UPDATE_DOCS=1 cargo test --test suite docs::` to rewrite them.

use std::io::Write;
use std::path::Path;

use clap_complete::Shell;
use cronlock::cli;

fn check(path: &Path, generated: &[u8], stale: &mut Vec<String>) {
    if std::env::var_os("CRONLOCK_UPDATE_DOCS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, generated).unwrap();
        return;
    }
    if std::fs::read(path).ok().as_deref() != Some(generated) {
        stale.push(path.display().to_string());
    }
}

/// Escape text for roff: backslashes, hyphens, and a leading control character.
fn roff(text: &str) -> String {
    let t = text.replace('\\', "\\e").replace('-', "\\-");
    if t.starts_with('.') || t.starts_with('\'') {
        format!("\\&{t}")
    } else {
        t
    }
}

/// Options that take a value, with their placeholder: `(["-t", "--ttl"], "DURATION")`.
fn valued_options() -> Vec<(Vec<String>, String)> {
    cli::command()
        .get_arguments()
        .filter(|a| !a.is_positional() && a.get_action().takes_values())
        .filter(|a| a.get_num_args().is_none_or(|n| n.max_values() > 0))
        .map(|a| {
            let mut names = Vec::new();
            if let Some(c) = a.get_short() {
                names.push(format!("-{c}"));
            }
            if let Some(l) = a.get_long() {
                names.push(format!("--{l}"));
            }
            let value = a
                .get_value_names()
                .and_then(|v| v.first())
                .map(|v| v.to_string())
                .unwrap_or_else(|| "VALUE".into());
            (names, value)
        })
        .collect()
}

/// SYNOPSIS with every option's value placeholder and each way to call cronlock.
fn synopsis(w: &mut Vec<u8>) {
    writeln!(w, ".SH SYNOPSIS").unwrap();
    let cmd = cli::command();
    let mut opts = Vec::new();
    for a in cmd.get_arguments().filter(|a| !a.is_positional()) {
        let id = a.get_id().as_str();
        if matches!(
            id,
            "status" | "list" | "force_release" | "shell_command" | "json"
        ) {
            continue;
        }
        let mut names = Vec::new();
        if let Some(c) = a.get_short() {
            names.push(format!("\\fB{}\\fR", roff(&format!("-{c}"))));
        }
        if let Some(l) = a.get_long() {
            names.push(format!("\\fB{}\\fR", roff(&format!("--{l}"))));
        }
        let value = match a.get_value_names().and_then(|v| v.first()) {
            Some(v) if a.get_action().takes_values() && id != "history" => {
                format!(" \\fI{v}\\fR")
            }
            Some(v) if id == "history" => format!(" [\\fI{v}\\fR]"),
            _ => String::new(),
        };
        opts.push(format!("[{}{value}]", names.join("|")));
    }
    let forms = [
        format!(
            "{} \\fIKEY\\fR [\\fB\\-\\-\\fR] \\fICOMMAND\\fR [\\fIARGS\\fR]...",
            opts.join(" ")
        ),
        format!(
            "{} \\fIKEY\\fR \\fB\\-c\\fR \\fISHELL_COMMAND\\fR",
            "[\\fIOPTIONS\\fR]"
        ),
        "\\fB\\-\\-status\\fR [\\fB\\-\\-json\\fR] [\\fB\\-\\-history\\fR [\\fIN\\fR]] \\fIKEY\\fR"
            .into(),
        "\\fB\\-\\-list\\fR [\\fB\\-\\-json\\fR]".into(),
        "\\fB\\-\\-force\\-release\\fR [\\fB\\-\\-json\\fR] \\fIKEY\\fR".into(),
    ];
    for (i, form) in forms.iter().enumerate() {
        if i > 0 {
            writeln!(w, ".br").unwrap();
        }
        writeln!(w, "\\fBcronlock\\fR {form}").unwrap();
    }
}

/// clap's bash completion, wrapped: after `--` it completes a command and its arguments (with
/// bash-completion's `_command_offset` when loaded), and values of options that are not files
/// (durations, numbers, the URL) do not complete as file names.
fn bash_completion() -> Vec<u8> {
    let mut out = Vec::new();
    clap_complete::generate(Shell::Bash, &mut cli::command(), "cronlock", &mut out);
    let not_files: Vec<String> = valued_options()
        .into_iter()
        .filter(|(names, _)| !names.iter().any(|n| n == "-c" || n == "--log-format"))
        .flat_map(|(names, _)| names)
        .collect();
    let mut text = String::from_utf8(out).unwrap();
    text += &format!(
        r#"
# cronlock: after `--`, complete a command and its arguments, not cronlock's options; option
# values that are durations, numbers or URLs do not complete as file names.
_cronlock_wrapper() {{
    local i
    for (( i=1; i < COMP_CWORD; i++ )); do
        if [[ ${{COMP_WORDS[i]}} == -- ]]; then
            if declare -F _command_offset >/dev/null; then
                _command_offset $((i + 1))
            elif (( i + 1 == COMP_CWORD )); then
                COMPREPLY=($(compgen -c -- "${{COMP_WORDS[COMP_CWORD]}}"))
            else
                COMPREPLY=($(compgen -f -- "${{COMP_WORDS[COMP_CWORD]}}"))
            fi
            return 0
        fi
    done
    case "${{COMP_WORDS[COMP_CWORD-1]}}" in
        {})
            compopt +o default +o bashdefault 2>/dev/null
            COMPREPLY=()
            return 0
            ;;
    esac
    _cronlock "$@"
}}
complete -F _cronlock_wrapper -o nosort -o bashdefault -o default cronlock
"#,
        not_files.join("|")
    );
    text.into_bytes()
}

fn man_page() -> Vec<u8> {
    // The long help's examples and table get proper roff sections instead of wrapped text.
    let cmd = cli::command().after_long_help("").after_help("");
    let man = clap_mangen::Man::new(cmd);
    let mut w = Vec::new();
    man.render_title(&mut w).unwrap();
    man.render_name_section(&mut w).unwrap();
    synopsis(&mut w);
    man.render_description_section(&mut w).unwrap();
    man.render_options_section(&mut w).unwrap();
    writeln!(w, ".SH \"EXIT STATUS\"").unwrap();
    for (code, meaning) in cli::EXIT_STATUS {
        writeln!(w, ".TP\n\\fB{}\\fR\n{}", roff(code), roff(meaning)).unwrap();
    }
    writeln!(w, ".SH ENVIRONMENT\n{}", roff(cli::CHILD_ENV)).unwrap();
    writeln!(w, ".SH EXAMPLES").unwrap();
    for (what, cmd) in cli::EXAMPLES {
        writeln!(
            w,
            ".PP\n{}\n.PP\n.RS 4\n.nf\n{}\n.fi\n.RE",
            roff(what),
            roff(cmd)
        )
        .unwrap();
    }
    man.render_version_section(&mut w).unwrap();
    w
}

#[test]
fn completions_and_man_page_match_the_cli() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut stale = Vec::new();
    check(
        &root.join("completions/cronlock.bash"),
        &bash_completion(),
        &mut stale,
    );
    for (shell, file) in [(Shell::Zsh, "_cronlock"), (Shell::Fish, "cronlock.fish")] {
        let mut out = Vec::new();
        clap_complete::generate(shell, &mut cli::command(), "cronlock", &mut out);
        check(&root.join("completions").join(file), &out, &mut stale);
    }
    check(&root.join("man/cronlock.1"), &man_page(), &mut stale);
    assert!(
        stale.is_empty(),
        "out of date: {stale:?}; run CRONLOCK_UPDATE_DOCS=1 cargo test --test suite docs:: and commit"
    );
}

/// Run the checked-in bash completion in a real bash for `words`, the cursor on the last one.
fn complete_in_bash(words: &[&str]) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let script = format!(
        "source {}; COMP_WORDS=({}); COMP_CWORD={}; COMP_LINE=\"${{COMP_WORDS[*]}}\"; \
         COMP_POINT=${{#COMP_LINE}}; _cronlock_wrapper cronlock \"${{COMP_WORDS[COMP_CWORD]}}\" \
         \"${{COMP_WORDS[COMP_CWORD-1]}}\"; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        root.join("completions/cronlock.bash").display(),
        words
            .iter()
            .map(|w| format!("'{w}'"))
            .collect::<Vec<_>>()
            .join(" "),
        words.len() - 1
    );
    let out = std::process::Command::new("bash")
        .args(["-c", &script])
        .current_dir(root)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

#[test]
fn bash_completes_commands_after_the_double_dash() {
    let after = complete_in_bash(&["cronlock", "k", "--", "ech"]);
    assert!(after.iter().any(|c| c == "echo"), "{after:?}");
    assert!(!after.iter().any(|c| c.starts_with("--")), "{after:?}");
    // Arguments of the command: files, never cronlock's options.
    let mut args = complete_in_bash(&["cronlock", "k", "--", "ls", "Carg"]);
    args.sort();
    assert_eq!(args, ["Cargo.lock", "Cargo.toml"], "{args:?}");
    let args = complete_in_bash(&["cronlock", "k", "--", "ls", "--"]);
    assert!(!args.iter().any(|c| c == "--ttl"), "{args:?}");
    // Durations are not file names.
    assert!(complete_in_bash(&["cronlock", "-t", ""]).is_empty());
    assert!(complete_in_bash(&["cronlock", "--ttl", "Car"]).is_empty());
    // Options still complete where they belong.
    let opts = complete_in_bash(&["cronlock", "--tt"]);
    assert_eq!(opts, ["--ttl"]);
}

/// The README and the manual under docs/, as (path, text).
fn manual() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut paths = vec![root.join("README.md")];
    let mut docs: Vec<_> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    paths.extend(docs);
    paths
        .into_iter()
        .map(|p| {
            (
                p.display().to_string(),
                std::fs::read_to_string(&p).unwrap(),
            )
        })
        .collect()
}

/// Every crontab line in the README, in docs/ and in examples/crontab works under cron's default
/// PATH (`/usr/bin:/bin`): its block sets a PATH with `/usr/local/bin`, or it names cronlock in
/// full.
#[test]
fn crontab_lines_work_under_crons_path() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut blocks: Vec<String> = manual()
        .iter()
        .flat_map(|(_, text)| {
            text.split("```")
                .skip(1)
                .step_by(2)
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect();
    blocks.push(std::fs::read_to_string(root.join("examples/crontab")).unwrap());
    let schedule = |l: &str| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() > 5
            && f[..5]
                .iter()
                .all(|w| w.chars().all(|c| c.is_ascii_digit() || "*/,-".contains(c)))
    };
    let mut checked = 0;
    for block in &blocks {
        let path_set = block
            .lines()
            .any(|l| l.starts_with("PATH=") && l.contains("/usr/local/bin"));
        for line in block
            .lines()
            .filter(|l| schedule(l) && l.contains("cronlock "))
        {
            checked += 1;
            let full = line.contains("/bin/cronlock ");
            assert!(
                path_set || full,
                "a crontab line that fails under cron's PATH: {line}"
            );
        }
    }
    assert!(checked >= 6, "only {checked} crontab lines found");
}

/// The README's exit-status table lists the codes of the one table in the CLI (`--help`, the man
/// page), in the same order.
#[test]
fn the_readme_exit_table_is_the_cli_table() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let table = readme
        .split("## Exit status")
        .nth(1)
        .expect("the README has an exit status section");
    // Markdown as plain text: no backticks, a link's text without its target.
    let plain = |cell: &str| -> String {
        let mut out = String::new();
        let mut rest = cell.trim().replace('`', "");
        while let Some(open) = rest.find('[') {
            let Some(close) = rest[open..].find("](").map(|c| open + c) else {
                break;
            };
            let Some(end) = rest[close..].find(')').map(|e| close + e) else {
                break;
            };
            out.push_str(&rest[..open]);
            out.push_str(&rest[open + 1..close]);
            rest = rest[end + 1..].to_string();
        }
        out + &rest
    };
    let rows: Vec<(String, String)> = table
        .lines()
        .skip_while(|l| !l.starts_with("| status"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').collect();
            (plain(cells[1]), plain(cells[2]))
        })
        .collect();
    let expected: Vec<(String, String)> = cli::EXIT_STATUS
        .iter()
        .map(|(code, meaning)| (code.to_string(), meaning.to_string()))
        .collect();
    // Codes and meanings alike: the README says what --help and the man page say.
    assert_eq!(rows, expected);
}

/// Every relative link in the README and docs/ names a file that exists, and every `#anchor` a
/// heading of that file.
#[test]
fn manual_links_resolve() {
    let anchor = |heading: &str| -> String {
        heading
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || *c == '-' || *c == ' ' || *c == '_')
            .map(|c| if c == ' ' { '-' } else { c })
            .collect()
    };
    let mut checked = 0;
    for (path, text) in manual() {
        let dir = Path::new(&path).parent().unwrap().to_path_buf();
        for link in text.split("](").skip(1) {
            let target = link.split(')').next().unwrap();
            if target.starts_with("http") || target.contains(' ') {
                continue;
            }
            let (file, frag) = target.split_once('#').unwrap_or((target, ""));
            let file = if file.is_empty() {
                Path::new(&path).to_path_buf()
            } else {
                dir.join(file)
            };
            assert!(
                file.exists(),
                "{path}: a link to a missing {}",
                file.display()
            );
            checked += 1;
            if frag.is_empty() || file.is_dir() {
                continue;
            }
            let target_text = std::fs::read_to_string(&file).unwrap();
            let found = target_text
                .lines()
                .filter_map(|l| l.strip_prefix('#'))
                .map(|l| anchor(l.trim_start_matches('#').trim()))
                .any(|a| a == frag);
            assert!(
                found,
                "{path}: no heading for #{frag} in {}",
                file.display()
            );
        }
    }
    assert!(checked >= 20, "only {checked} links checked");
}

/// Every file and module ARCHITECTURE.md cites exists: a cited `x/y.rs` (or a bare `y.rs`) is
/// some file of `src/` or `tests/` ending so, and a cited module path (`fleet::describe`,
/// `job::supervise::Keeper`) is a file of `src/` named by its lowercase segments.
#[test]
fn architecture_cites_only_paths_that_exist() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let files: Vec<String> = ["src", "tests", "scripts"]
        .iter()
        .flat_map(|d| crate::common::files_under(&root.join(d)))
        .filter_map(|p| Some(p.strip_prefix(root).ok()?.to_string_lossy().into_owned()))
        .collect();
    let exists = |suffix: &str| {
        files
            .iter()
            .any(|f| f == suffix || f.ends_with(&format!("/{suffix}")))
    };
    let text = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let mut missing = Vec::new();
    for cited in text.split('`').skip(1).step_by(2) {
        if cited.contains(' ')
            || cited
                .chars()
                .any(|c| c.is_ascii_uppercase() && cited.contains('/'))
        {
            continue;
        }
        let path = cited.split("::").next().unwrap_or_default();
        if path.ends_with(".rs") {
            if !exists(path) {
                missing.push(cited.to_string());
            }
            continue;
        }
        let modules: Vec<&str> = cited
            .split("::")
            .take_while(|s| s.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
            .collect();
        if !cited.contains("::") || modules.is_empty() || modules[0] == "crate" {
            continue;
        }
        // The crate itself, paths relative to a file, and other crates.
        let outside = [
            "cronlock", "super", "self", "std", "rustls", "serde", "clap", "nix",
        ];
        if outside.contains(&modules[0]) {
            continue;
        }
        // `a::b::item` names a function of `a/b.rs`: the longest prefix that is a file counts.
        let found = (1..=modules.len()).rev().any(|n| {
            let m = modules[..n].join("/");
            exists(&format!("{m}.rs")) || exists(&format!("{m}/mod.rs"))
        });
        if !found {
            missing.push(cited.to_string());
        }
    }
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md cites what does not exist: {missing:#?}"
    );
}

/// The Rust sources under `src/` and `tests/`, as (path relative to either, text).
fn sources() -> Vec<(String, String)> {
    let mut found = Vec::new();
    for root in ["src", "tests"] {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(root);
        for path in crate::common::files_under(&root) {
            if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(&root).unwrap();
                let text = std::fs::read_to_string(&path).unwrap();
                found.push((rel.to_string_lossy().into_owned(), text));
            }
        }
    }
    found
}

/// Whether `text` defines an item (or a field or variant) named `name`.
fn defines(text: &str, name: &str) -> bool {
    let kinds = [
        "struct", "enum", "trait", "type", "fn", "const", "static", "mod", "union",
    ];
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(name).any(|(at, _)| {
        let after = text[at + name.len()..].chars().next();
        if text[..at].chars().next_back().is_some_and(ident) || after.is_some_and(ident) {
            return false;
        }
        let before = text[..at].trim_end();
        let word = before.rsplit(|c: char| !ident(c)).next().unwrap_or("");
        let line = &text[text[..at].rfind('\n').map_or(0, |n| n + 1)..at];
        // An item, or a field (`name:`) or variant (`Name,`, `Name(`, or `Name` and a brace) at a
        // line's start.
        let starts_line =
            line.trim().is_empty() || line.trim() == "pub" || line.trim().starts_with("pub(");
        let variant = name.starts_with(|c: char| c.is_ascii_uppercase())
            && after.is_some_and(|c| matches!(c, ',' | '(' | ' ' | '{'));
        kinds.contains(&word) || starts_line && (after == Some(':') || variant)
    })
}

/// Every Rust item ARCHITECTURE.md cites by name exists: a qualified one (`store::acquire::
/// AcquireOutcome`, `run/mod.rs::start`, `Link::unpin`) is defined in the file its module path
/// names (a `Type::item` anywhere a file defines both), and a bare type name (`RunConfig`,
/// `Shown`) or function name with an underscore (`run_job`) somewhere in `src/` or `tests/`. Other bare
/// lowercase words are left alone: they are as often flags, states or plain words (`take`,
/// `fork`, `released`) as functions.
#[test]
fn architecture_cites_only_items_that_exist() {
    let sources = sources();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let is_ident = |s: &str| {
        !s.is_empty()
            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !s.starts_with(|c: char| c.is_ascii_digit())
    };
    let outside = [
        "cronlock", "super", "self", "std", "rustls", "serde", "clap", "nix", "crate", "libc",
    ];
    let mut missing = Vec::new();
    let mut checked = 0;
    for cited in text.split('`').skip(1).step_by(2) {
        let cited = cited.trim_end_matches("()");
        let mut parts: Vec<&str> = cited.split("::").collect();
        let first_is_file = parts[0].ends_with(".rs");
        if parts.len() == 1 {
            // A bare type name: CamelCase, not an ALL_CAPS constant of libc's.
            let name = parts[0];
            let camel = name.starts_with(|c: char| c.is_ascii_uppercase())
                && name.chars().any(|c| c.is_ascii_lowercase());
            // A function's name: lowercase with an underscore (`run_job`), not one of libc's
            // or std's.
            let function = name.contains('_')
                && name.starts_with(|c: char| c.is_ascii_lowercase())
                && !["posix_spawn", "pre_exec"].contains(&name);
            if is_ident(name) && (camel || function) {
                checked += 1;
                if !sources.iter().any(|(_, t)| defines(t, name)) {
                    missing.push(cited.to_string());
                }
            }
            continue;
        }
        if outside.contains(&parts[0])
            || !parts[1..].iter().all(|p| is_ident(p))
            || !(first_is_file || is_ident(parts[0]))
        {
            continue;
        }
        checked += 1;
        let name = parts.pop().unwrap();
        // The files the module path may name (`holder::` is `record/holder.rs` or
        // `store/holder.rs`): those of the longest prefix of lowercase segments that names any.
        let named = |m: &str| -> Vec<&str> {
            sources
                .iter()
                .filter(|(p, _)| {
                    [format!("{m}.rs"), format!("{m}/mod.rs")]
                        .iter()
                        .any(|want| p == want || p.ends_with(&format!("/{want}")))
                })
                .map(|(_, t)| t.as_str())
                .collect()
        };
        let (files, types): (Vec<&str>, &[&str]) = if first_is_file {
            (named(parts[0].trim_end_matches(".rs")), &parts[1..])
        } else {
            let modules = parts
                .iter()
                .take_while(|s| s.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
                .count();
            match (1..=modules)
                .rev()
                .map(|n| (n, named(&parts[..n].join("/"))))
                .find(|(_, f)| !f.is_empty())
            {
                Some((n, f)) => (f, &parts[n..]),
                None if modules == 0 => (
                    sources.iter().map(|(_, t)| t.as_str()).collect(),
                    &parts[..],
                ),
                None => {
                    missing.push(cited.to_string());
                    continue;
                }
            }
        };
        // What is left of the path are the types the item belongs to (`Type::method`).
        let ok = files.iter().any(|t| {
            defines(t, name)
                && types.iter().all(|ty| {
                    defines(t, ty)
                        || t.contains(&format!("impl {ty}"))
                        || t.contains(&format!("for {ty}"))
                })
        });
        if !ok {
            missing.push(cited.to_string());
        }
    }
    assert!(checked >= 50, "only {checked} names checked");
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md cites items that do not exist: {missing:#?}"
    );
}
