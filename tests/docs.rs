//! `completions/` and `man/cronlock.1` are generated from the clap definition and checked in.
//! This test regenerates them and fails when the checked-in files differ.
//! Run with `CRONLOCK_UPDATE_DOCS=1 cargo test --test docs` to rewrite them.

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

fn man_page() -> Vec<u8> {
    // The long help's examples and table get proper roff sections instead of wrapped text.
    let cmd = cli::command().after_long_help("").after_help("");
    let man = clap_mangen::Man::new(cmd);
    let mut w = Vec::new();
    man.render_title(&mut w).unwrap();
    man.render_name_section(&mut w).unwrap();
    man.render_synopsis_section(&mut w).unwrap();
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
    for (shell, file) in [
        (Shell::Bash, "cronlock.bash"),
        (Shell::Zsh, "_cronlock"),
        (Shell::Fish, "cronlock.fish"),
    ] {
        let mut out = Vec::new();
        clap_complete::generate(shell, &mut cli::command(), "cronlock", &mut out);
        check(&root.join("completions").join(file), &out, &mut stale);
    }
    check(&root.join("man/cronlock.1"), &man_page(), &mut stale);
    assert!(
        stale.is_empty(),
        "out of date: {stale:?}; run CRONLOCK_UPDATE_DOCS=1 cargo test --test docs and commit"
    );
}
