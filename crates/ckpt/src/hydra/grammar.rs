//! OmegaConf's interpolation grammar: a value's text split into literal
//! text and `${...}` interpolations (node references and resolver calls).

use std::fmt;

use super::value::Val;
use super::yaml::{all, digits_underscored, strip_sign};
use super::{Problem, MAX_DEPTH};

/// A piece of a string value: text, or an interpolation.
#[derive(Debug, Clone)]
pub(super) enum Piece {
    Text(String),
    Interp(Interp),
}

#[derive(Debug, Clone)]
pub(super) enum Interp {
    /// `${..a.b[0]}`: `dots` leading dots, then the keys.
    Node { dots: usize, keys: Vec<String>, text: String },
    /// `${name:arg,arg}`.
    Resolver { name: String, args: Vec<Arg> },
}

#[derive(Debug, Clone)]
pub(super) enum Arg {
    /// Unquoted: typed as a primitive when it is one token, the value of a
    /// lone interpolation, otherwise a string. `escaped` marks backslash
    /// escapes, which make the text a string.
    Unquoted {
        pieces: Vec<Piece>,
        escaped: bool,
    },
    /// Quoted: always a string.
    Quoted(Vec<Piece>),
    List(Vec<Arg>),
}

pub(super) struct Grammar<'a> {
    chars: Vec<char>,
    pos: usize,
    text: &'a str,
}

impl<'a> Grammar<'a> {
    pub(super) fn new(text: &'a str) -> Self {
        Grammar { chars: text.chars().collect(), pos: 0, text }
    }

    fn err(&self, reason: impl fmt::Display) -> Problem {
        Problem::Grammar { text: self.text.to_string(), reason: format!("{reason} at char {}", self.pos) }
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn starts(&self, s: &str) -> bool {
        s.chars().enumerate().all(|(i, c)| self.chars.get(self.pos + i) == Some(&c))
    }

    fn skip_ws(&mut self) {
        while matches!(self.peek(), Some(' ' | '\t')) {
            self.pos += 1;
        }
    }

    /// The whole value: text with `${...}`; `\${` is a literal `${` and
    /// `\\` before `${` a literal backslash; other backslashes are kept.
    pub(super) fn top(&mut self) -> Result<Vec<Piece>, Problem> {
        let mut pieces = Vec::new();
        let mut text = String::new();
        while let Some(c) = self.peek() {
            if c == '\\' {
                let start = self.pos;
                while self.peek() == Some('\\') {
                    self.pos += 1;
                }
                let n = self.pos - start;
                if self.starts("${") {
                    text.extend(std::iter::repeat_n('\\', n / 2));
                    if n % 2 == 1 {
                        text.push_str("${");
                        self.pos += 2;
                    }
                } else {
                    text.extend(std::iter::repeat_n('\\', n));
                }
            } else if self.starts("${") {
                if !text.is_empty() {
                    pieces.push(Piece::Text(std::mem::take(&mut text)));
                }
                pieces.push(Piece::Interp(self.interp(0)?));
            } else {
                text.push(c);
                self.pos += 1;
            }
        }
        if !text.is_empty() {
            pieces.push(Piece::Text(text));
        }
        Ok(pieces)
    }

    fn interp(&mut self, depth: usize) -> Result<Interp, Problem> {
        if depth >= MAX_DEPTH {
            return Err(Problem::Limit(format!("interpolations nested deeper than {MAX_DEPTH}")));
        }
        self.pos += 2; // `${`
        self.skip_ws();
        let start = self.pos;
        // A resolver's name is ID(.ID)*, then optional blanks and `:`.
        let mut p = self.pos;
        while self.chars.get(p).is_some_and(|c| c.is_alphanumeric() || *c == '_' || *c == '.') {
            p += 1;
        }
        let name: String = self.chars[start..p].iter().collect();
        let mut q = p;
        while matches!(self.chars.get(q), Some(' ' | '\t')) {
            q += 1;
        }
        let is_resolver = !name.is_empty()
            && name.starts_with(|c: char| c.is_alphabetic() || c == '_')
            && self.chars.get(q) == Some(&':');
        if is_resolver {
            self.pos = q + 1;
            let args = self.args(depth)?;
            if self.peek() != Some('}') {
                return Err(self.err("expected `}` closing the resolver call"));
            }
            self.pos += 1;
            return Ok(Interp::Resolver { name, args });
        }
        // A node path: dots, keys separated by `.` or `[N]`.
        let mut dots = 0;
        while self.peek() == Some('.') {
            dots += 1;
            self.pos += 1;
        }
        let mut keys = Vec::new();
        let mut key = String::new();
        loop {
            match self.peek() {
                None => return Err(self.err("unterminated `${`")),
                Some('}') => {
                    if !key.is_empty() {
                        keys.push(std::mem::take(&mut key));
                    }
                    self.pos += 1;
                    break;
                }
                Some('.') => {
                    if key.is_empty() && !matches!(self.chars.get(self.pos.wrapping_sub(1)), Some(']')) {
                        return Err(self.err("empty key in path"));
                    }
                    if !key.is_empty() {
                        keys.push(std::mem::take(&mut key));
                    }
                    self.pos += 1;
                }
                Some('[') => {
                    if !key.is_empty() {
                        keys.push(std::mem::take(&mut key));
                    }
                    self.pos += 1;
                    let s = self.pos;
                    while self.peek().is_some_and(|c| c != ']') {
                        self.pos += 1;
                    }
                    if self.peek() != Some(']') {
                        return Err(self.err("unterminated `[`"));
                    }
                    keys.push(self.chars[s..self.pos].iter().collect());
                    self.pos += 1;
                }
                Some(' ' | '\t') => {
                    self.skip_ws();
                    if self.peek() != Some('}') {
                        return Err(self.err("blank inside a key path"));
                    }
                }
                Some('$') if self.starts("${") => {
                    return Err(self.err("interpolations inside a key path are not supported"));
                }
                Some(c @ ('\\' | '{' | '(' | ')' | ':' | '\'' | '"')) => {
                    return Err(self.err(format_args!("`{c}` inside a key path")));
                }
                Some(c) => {
                    key.push(c);
                    self.pos += 1;
                }
            }
        }
        let text: String = self.chars[start.saturating_sub(0)..self.pos.saturating_sub(1)].iter().collect();
        Ok(Interp::Node { dots, keys, text: text.trim().to_string() })
    }

    /// Comma-separated arguments up to (not past) `}` or `]`.
    fn args(&mut self, depth: usize) -> Result<Vec<Arg>, Problem> {
        let mut args = Vec::new();
        loop {
            args.push(self.arg(depth)?);
            match self.peek() {
                Some(',') => self.pos += 1,
                Some('}' | ']') => return Ok(args),
                None => return Err(self.err("unterminated resolver call")),
                Some(c) => return Err(self.err(format_args!("unexpected `{c}`"))),
            }
        }
    }

    fn arg(&mut self, depth: usize) -> Result<Arg, Problem> {
        self.skip_ws();
        match self.peek() {
            Some(q @ ('\'' | '"')) => {
                self.pos += 1;
                let mut pieces = Vec::new();
                let mut text = String::new();
                loop {
                    match self.peek() {
                        None => return Err(self.err("unterminated quoted string")),
                        Some(c) if c == q => {
                            self.pos += 1;
                            break;
                        }
                        Some('\\') if matches!(self.chars.get(self.pos + 1), Some(&c) if c == q || c == '\\') => {
                            text.push(self.chars[self.pos + 1]);
                            self.pos += 2;
                        }
                        Some('$') if self.starts("${") => {
                            if !text.is_empty() {
                                pieces.push(Piece::Text(std::mem::take(&mut text)));
                            }
                            pieces.push(Piece::Interp(self.interp(depth + 1)?));
                        }
                        Some(c) => {
                            text.push(c);
                            self.pos += 1;
                        }
                    }
                }
                if !text.is_empty() {
                    pieces.push(Piece::Text(text));
                }
                self.skip_ws();
                Ok(Arg::Quoted(pieces))
            }
            Some('[') => {
                if depth + 1 >= MAX_DEPTH {
                    return Err(Problem::Limit(format!("lists nested deeper than {MAX_DEPTH}")));
                }
                self.pos += 1;
                self.skip_ws();
                let items = if self.peek() == Some(']') { Vec::new() } else { self.args(depth + 1)? };
                if self.peek() != Some(']') {
                    return Err(self.err("expected `]`"));
                }
                self.pos += 1;
                self.skip_ws();
                Ok(Arg::List(items))
            }
            Some('{') => Err(self.err("dict arguments are not supported")),
            _ => {
                let mut pieces = Vec::new();
                let mut text = String::new();
                let mut escaped = false;
                loop {
                    match self.peek() {
                        None | Some(',' | '}' | ']') => break,
                        Some('\\') => match self.chars.get(self.pos + 1) {
                            Some(&c @ ('(' | ')' | '[' | ']' | '{' | '}' | ':' | '=' | ',' | ' ' | '\t' | '\\')) => {
                                text.push(c);
                                escaped = true;
                                self.pos += 2;
                            }
                            // OmegaConf's lexer takes a backslash escaping
                            // nothing as an ordinary character.
                            _ => {
                                text.push('\\');
                                self.pos += 1;
                            }
                        },
                        Some('$') if self.starts("${") => {
                            if !text.is_empty() {
                                pieces.push(Piece::Text(std::mem::take(&mut text)));
                            }
                            pieces.push(Piece::Interp(self.interp(depth + 1)?));
                        }
                        Some(
                            c @ ('(' | ')' | '[' | '{' | '\'' | '"' | '=' | '<' | '>' | '!' | '&' | '#' | '~' | '^'
                            | ';'),
                        ) => {
                            // OmegaConf's lexer has no token for these outside quotes.
                            return Err(self.err(format_args!("`{c}` must be escaped in a resolver argument")));
                        }
                        Some(c) => {
                            text.push(c);
                            self.pos += 1;
                        }
                    }
                }
                if !text.is_empty() {
                    pieces.push(Piece::Text(text));
                }
                Ok(Arg::Unquoted { pieces, escaped })
            }
        }
    }
}

/// OmegaConf's primitive tokens: `null`, `true`/`false` (any case), INT
/// (`[+-]?(0|[1-9](_?[0-9])*)`), FLOAT (point/exponent forms, `inf`, `nan`).
pub(super) fn grammar_primitive(s: &str) -> Val {
    let lower = s.to_ascii_lowercase();
    match lower.as_str() {
        "null" => return Val::Null,
        "true" => return Val::Bool(true),
        "false" => return Val::Bool(false),
        _ => {}
    }
    let (neg, u) = strip_sign(&lower);
    let int_part = |t: &str| t == "0" || (t.starts_with(|c: char| ('1'..='9').contains(&c)) && digits_underscored(t));
    let digit_part = |t: &str| digits_underscored(t);
    if int_part(u) {
        let cleaned: String = u.chars().filter(|&c| c != '_').collect();
        if let Ok(i) = cleaned.parse::<i64>() {
            return Val::Int(if neg { -i } else { i });
        }
        return Val::Str(s.to_string());
    }
    let sign = if neg { -1.0 } else { 1.0 };
    if u == "inf" {
        return Val::Float(sign * f64::INFINITY);
    }
    if u == "nan" {
        return Val::Float(f64::NAN);
    }
    let (mant, exp) = match u.find('e') {
        Some(i) => (&u[..i], Some(&u[i + 1..])),
        None => (u, None),
    };
    let mant_ok = match mant.split_once('.') {
        Some((i, f)) => {
            (i.is_empty() && digit_part(f)) || (!i.is_empty() && digit_part(i) && (f.is_empty() || digit_part(f)))
        }
        None => exp.is_some() && digit_part(mant),
    };
    let exp_ok = exp.is_none_or(|e| {
        all(e.trim_start_matches(['+', '-']), |c| c.is_ascii_digit())
            && e.len() - e.trim_start_matches(['+', '-']).len() <= 1
    });
    if mant_ok && exp_ok {
        let cleaned: String = u.chars().filter(|&c| c != '_').collect();
        if let Ok(f) = cleaned.parse::<f64>() {
            return Val::Float(sign * f);
        }
    }
    Val::Str(s.to_string())
}
