//! Everything the CLI prints goes through here.
//!
//! A terminal is not a trusted channel: keys, strings and global names come
//! from the files being read, and a key holding `\x1b[8m` (conceal) or a
//! carriage return could hide the line that reports an unsafe global. Text
//! output therefore escapes control characters (C0, DEL, C1) and the Unicode
//! bidirectional controls ("Trojan Source") as `\x1b` / `\u{202e}`. JSON
//! output needs nothing more: serde_json escapes control characters itself.
//!
//! A closed pipe (`pmstate inspect X | head`) is not an error: printing
//! stops and the process exits 0 without a message, as `cat` and `grep` do.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::io::{ErrorKind, Write};

/// Whether `c` is a character a terminal may act on instead of showing.
fn is_hazard(c: char) -> bool {
    c.is_control() // C0, DEL and C1
        || matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `s` with every control or bidi-control character written as an escape
/// (`\x1b`, `\n`, `\u{202e}`); borrowed when there is nothing to escape.
pub fn escape(s: &str) -> Cow<'_, str> {
    if !s.chars().any(is_hazard) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if is_hazard(c) && (c as u32) < 0x100 => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if is_hazard(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// Writes one line to stdout, escaped; a closed pipe ends the process quietly.
pub fn line(s: impl std::fmt::Display) {
    let text = s.to_string();
    write_stdout(&escape(&text));
}

/// Writes one line of JSON to stdout (serde_json has escaped it already).
pub fn json_line(value: &impl serde::Serialize) -> Result<(), serde_json::Error> {
    let text = serde_json::to_string(value)?;
    write_stdout(&text);
    Ok(())
}

/// Writes one line to stderr, escaped (warnings, refusals, errors).
pub fn err_line(s: impl std::fmt::Display) {
    let text = s.to_string();
    let mut e = std::io::stderr().lock();
    let _ = writeln!(e, "{}", escape(&text));
}

fn write_stdout(text: &str) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = writeln!(out, "{text}") {
        if e.kind() == ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        let _ = writeln!(std::io::stderr(), "pmstate: error: writing output: {e}");
        std::process::exit(2);
    }
}

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn control_and_bidi_characters_are_escaped() {
        assert_eq!(escape("plain.key_1"), "plain.key_1");
        assert_eq!(escape("a\x1b[8mb"), "a\\x1b[8mb");
        assert_eq!(escape("x\ry\nz\t"), "x\\ry\\nz\\t");
        assert_eq!(escape("\u{7f}\u{85}"), "\\x7f\\x85");
        assert_eq!(escape("abc\u{202e}cba"), "abc\\u{202e}cba");
        assert_eq!(escape("naïve µs ✓"), "naïve µs ✓");
    }
}
