//! Enough of Go to read the conformance suite's test files: a lexer (with
//! Go's automatic semicolons) and a parser for declarations, statements
//! and expressions. Only what the suite's files use is read; anything
//! else is an error naming the line, so a test that cannot be read is
//! reported, never half-read.

use std::fmt;

#[derive(Debug, Clone, PartialEq)]
pub enum Tok {
    Ident(String),
    Str(String),
    Int(i64),
    Float(f64),
    Char(char),
    Op(&'static str),
    Semi,
    Eof,
}

impl fmt::Display for Tok {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tok::Ident(s) => write!(f, "{s}"),
            Tok::Str(s) => write!(f, "{s:?}"),
            Tok::Int(i) => write!(f, "{i}"),
            Tok::Float(x) => write!(f, "{x}"),
            Tok::Char(c) => write!(f, "{c:?}"),
            Tok::Op(o) => write!(f, "{o}"),
            Tok::Semi => write!(f, ";"),
            Tok::Eof => write!(f, "end of file"),
        }
    }
}

/// Longest first, so that `<-`, `...`, `&&=`… win over their prefixes.
const OPS: [&str; 47] = [
    "...", "<<=", ">>=", "&^=", "&&", "||", "<-", "++", "--", "==", "!=", "<=", ">=", ":=", "+=",
    "-=", "*=", "/=", "%=", "&=", "|=", "^=", "<<", ">>", "&^", "+", "-", "*", "/", "%", "&", "|",
    "^", "<", ">", "=", "!", "(", ")", "[", "]", "{", "}", ",", ";", ".", ":",
];

pub fn lex(src: &str) -> Result<Vec<(Tok, usize)>, String> {
    let bytes = src.as_bytes();
    let mut out: Vec<(Tok, usize)> = Vec::new();
    let mut i = 0;
    let mut line = 1;
    // Go inserts a semicolon at a newline after these tokens.
    let ends_statement = |t: &Tok| match t {
        Tok::Ident(s) => {
            !matches!(
                s.as_str(),
                "package"
                    | "import"
                    | "var"
                    | "const"
                    | "type"
                    | "func"
                    | "if"
                    | "else"
                    | "for"
                    | "switch"
                    | "case"
                    | "default"
                    | "range"
                    | "go"
                    | "defer"
                    | "map"
                    | "struct"
                    | "interface"
                    | "chan"
                    | "select"
            ) || matches!(s.as_str(), "break" | "continue" | "fallthrough" | "return")
        }
        Tok::Str(_) | Tok::Int(_) | Tok::Float(_) | Tok::Char(_) => true,
        Tok::Op(o) => matches!(*o, "++" | "--" | ")" | "]" | "}"),
        _ => false,
    };
    while i < bytes.len() {
        let c = bytes[i];
        if c == b'\n' {
            if out.last().is_some_and(|(t, _)| ends_statement(t)) {
                out.push((Tok::Semi, line));
            }
            line += 1;
            i += 1;
            continue;
        }
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        if src[i..].starts_with("//") {
            while i < bytes.len() && bytes[i] != b'\n' {
                i += 1;
            }
            continue;
        }
        if src[i..].starts_with("/*") {
            let end = src[i + 2..]
                .find("*/")
                .ok_or(format!("line {line}: unterminated comment"))?;
            let comment = &src[i..i + 2 + end + 2];
            let newlines = comment.matches('\n').count();
            if newlines > 0 && out.last().is_some_and(|(t, _)| ends_statement(t)) {
                out.push((Tok::Semi, line));
            }
            line += newlines;
            i += 2 + end + 2;
            continue;
        }
        if c.is_ascii_alphabetic() || c == b'_' {
            let start = i;
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
            out.push((Tok::Ident(src[start..i].to_owned()), line));
            continue;
        }
        if c.is_ascii_digit() {
            let start = i;
            while i < bytes.len()
                && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'.' || bytes[i] == b'_')
            {
                i += 1;
            }
            let text = src[start..i].replace('_', "");
            let tok = if let Some(hex) = text.strip_prefix("0x") {
                Tok::Int(i64::from_str_radix(hex, 16).map_err(|e| format!("line {line}: {e}"))?)
            } else if text.contains('.') || text.contains('e') {
                Tok::Float(text.parse().map_err(|e| format!("line {line}: {e}"))?)
            } else {
                Tok::Int(text.parse().map_err(|e| format!("line {line}: {e}"))?)
            };
            out.push((tok, line));
            continue;
        }
        if c == b'"' {
            let mut s = String::new();
            i += 1;
            loop {
                let Some(&b) = bytes.get(i) else {
                    return Err(format!("line {line}: unterminated string"));
                };
                match b {
                    b'"' => {
                        i += 1;
                        break;
                    }
                    b'\\' => {
                        let e = bytes.get(i + 1).copied().unwrap_or(b'\\');
                        i += 2;
                        match e {
                            b'n' => s.push('\n'),
                            b't' => s.push('\t'),
                            b'r' => s.push('\r'),
                            b'\\' => s.push('\\'),
                            b'"' => s.push('"'),
                            b'\'' => s.push('\''),
                            b'x' => {
                                let hex = &src[i..i + 2];
                                s.push(u8::from_str_radix(hex, 16).unwrap_or(b'?') as char);
                                i += 2;
                            }
                            b'u' => {
                                let hex = &src[i..i + 4];
                                s.push(
                                    u32::from_str_radix(hex, 16)
                                        .ok()
                                        .and_then(char::from_u32)
                                        .unwrap_or('?'),
                                );
                                i += 4;
                            }
                            other => s.push(other as char),
                        }
                    }
                    _ => {
                        let ch = src[i..].chars().next().unwrap_or('?');
                        s.push(ch);
                        i += ch.len_utf8();
                    }
                }
            }
            out.push((Tok::Str(s), line));
            continue;
        }
        if c == b'`' {
            let end = src[i + 1..]
                .find('`')
                .ok_or(format!("line {line}: unterminated raw string"))?;
            let s = &src[i + 1..i + 1 + end];
            out.push((Tok::Str(s.to_owned()), line));
            line += s.matches('\n').count();
            i += end + 2;
            continue;
        }
        if c == b'\'' {
            let rest = &src[i + 1..];
            let mut chars = rest.chars();
            let ch = match chars.next() {
                Some('\\') => match chars.next() {
                    Some('n') => '\n',
                    Some('t') => '\t',
                    Some(other) => other,
                    None => '\\',
                },
                Some(ch) => ch,
                None => return Err(format!("line {line}: bad rune")),
            };
            let end = rest
                .find('\'')
                .ok_or(format!("line {line}: unterminated rune"))?;
            out.push((Tok::Char(ch), line));
            i += end + 2;
            continue;
        }
        let Some(op) = OPS.iter().find(|op| src[i..].starts_with(**op)) else {
            return Err(format!("line {line}: unexpected character {:?}", c as char));
        };
        i += op.len();
        out.push((if *op == ";" { Tok::Semi } else { Tok::Op(op) }, line));
    }
    if out.last().is_some_and(|(t, _)| ends_statement(t)) {
        out.push((Tok::Semi, line));
    }
    out.push((Tok::Eof, line));
    Ok(out)
}

#[derive(Debug, Clone)]
pub enum Type {
    /// `T` or `pkg.T` (the package is kept, for conversions).
    Named(String),
    Slice(Box<Type>),
    Array(Box<Type>),
    /// `map[K]V` (the value type; keys need none here).
    Map(Box<Type>),
    Pointer(Box<Type>),
    Struct(Vec<String>),
    Func,
    Other,
}

#[derive(Debug, Clone)]
pub enum Expr {
    Ident(String),
    Str(String),
    Int(i64),
    Float(f64),
    Selector(Box<Expr>, String),
    Call {
        func: Box<Expr>,
        args: Vec<Expr>,
        spread: bool,
    },
    Index(Box<Expr>, Box<Expr>),
    Slice(Box<Expr>, Option<Box<Expr>>, Option<Box<Expr>>),
    Composite {
        ty: Option<Type>,
        elems: Vec<(Option<Expr>, Expr)>,
    },
    Unary(&'static str, Box<Expr>),
    Binary(&'static str, Box<Expr>, Box<Expr>),
    Func {
        params: Vec<String>,
        body: Block,
    },
    Type(Type),
    TypeAssert(Box<Expr>),
}

pub type Block = Vec<Stmt>;

#[derive(Debug, Clone)]
pub enum Stmt {
    Expr(Expr),
    Define(Vec<String>, Vec<Expr>),
    Assign(Vec<Expr>, &'static str, Vec<Expr>),
    IncDec(Expr, bool),
    If {
        init: Option<Box<Stmt>>,
        cond: Expr,
        then: Block,
        otherwise: Option<Box<Stmt>>,
    },
    For {
        init: Option<Box<Stmt>>,
        cond: Option<Expr>,
        post: Option<Box<Stmt>>,
        body: Block,
    },
    Range {
        key: Option<String>,
        value: Option<String>,
        expr: Expr,
        body: Block,
    },
    Switch {
        init: Option<Box<Stmt>>,
        tag: Option<Expr>,
        cases: Vec<(Option<Vec<Expr>>, Block)>,
    },
    Return(Vec<Expr>),
    Block(Block),
    /// Statements in the current scope (a `var ( … )` group).
    Multi(Vec<Stmt>),
    Break,
    Continue,
    Defer(Expr),
    Empty,
}

/// A top-level function.
#[derive(Debug, Clone)]
pub struct FuncDecl {
    pub name: String,
    pub params: Vec<String>,
    /// Named results (`(newAddrs []T)`), zero at the start.
    pub results: Vec<String>,
    pub body: Block,
}

#[derive(Debug, Default)]
pub struct File {
    pub funcs: Vec<FuncDecl>,
    /// `var`/`const` at the top: name, value.
    pub values: Vec<(String, Expr)>,
    /// `(alias, path)`: the alias is the path's last element when none
    /// is written.
    pub imports: Vec<(String, String)>,
}

/// One `var`/`const` spec: names, type, values.
type VarSpec = (Vec<String>, Option<Type>, Vec<Expr>);

pub struct Parser {
    toks: Vec<(Tok, usize)>,
    pos: usize,
    /// In an `if`/`for`/`switch` header a `{` opens the block, not a
    /// composite literal (Go's own rule).
    no_literal: bool,
}

type R<T> = Result<T, String>;

impl Parser {
    pub fn new(src: &str) -> R<Parser> {
        Ok(Parser {
            toks: lex(src)?,
            pos: 0,
            no_literal: false,
        })
    }

    fn peek(&self) -> &Tok {
        &self.toks[self.pos.min(self.toks.len() - 1)].0
    }

    fn peek_at(&self, n: usize) -> &Tok {
        &self.toks[(self.pos + n).min(self.toks.len() - 1)].0
    }

    pub fn line(&self) -> usize {
        self.toks[self.pos.min(self.toks.len() - 1)].1
    }

    fn next(&mut self) -> Tok {
        let t = self.peek().clone();
        self.pos += 1;
        t
    }

    fn is(&self, op: &str) -> bool {
        matches!(self.peek(), Tok::Op(o) if *o == op)
    }

    fn is_kw(&self, kw: &str) -> bool {
        matches!(self.peek(), Tok::Ident(s) if s == kw)
    }

    fn eat(&mut self, op: &str) -> bool {
        if self.is(op) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, op: &str) -> R<()> {
        if self.eat(op) {
            Ok(())
        } else {
            Err(self.error(&format!("expected {op}")))
        }
    }

    fn error(&self, what: &str) -> String {
        format!("line {}: {what}, found {}", self.line(), self.peek())
    }

    fn ident(&mut self) -> R<String> {
        match self.next() {
            Tok::Ident(s) => Ok(s),
            other => {
                self.pos -= 1;
                Err(self.error(&format!("expected a name, not {other}")))
            }
        }
    }

    fn skip_semis(&mut self) {
        while matches!(self.peek(), Tok::Semi) {
            self.pos += 1;
        }
    }

    /// Skips a balanced group starting at the current `(`, `[` or `{`.
    fn skip_group(&mut self) -> R<()> {
        let mut depth = 0usize;
        loop {
            match self.next() {
                Tok::Op("(" | "[" | "{") => depth += 1,
                Tok::Op(")" | "]" | "}") => {
                    depth -= 1;
                    if depth == 0 {
                        return Ok(());
                    }
                }
                Tok::Eof => return Err(self.error("unbalanced brackets")),
                _ => {}
            }
        }
    }

    pub fn file(&mut self) -> R<File> {
        let mut file = File::default();
        self.skip_semis();
        while !matches!(self.peek(), Tok::Eof) {
            let Tok::Ident(kw) = self.peek().clone() else {
                return Err(self.error("expected a declaration"));
            };
            match kw.as_str() {
                "package" => {
                    self.next();
                    self.ident()?;
                }
                "import" => {
                    self.next();
                    let group = self.eat("(");
                    loop {
                        self.skip_semis();
                        if group && self.eat(")") {
                            break;
                        }
                        let alias = match self.peek().clone() {
                            Tok::Ident(a) => {
                                self.next();
                                Some(a)
                            }
                            Tok::Op(".") => {
                                self.next();
                                Some(".".to_owned())
                            }
                            _ => None,
                        };
                        let Tok::Str(path) = self.next() else {
                            return Err(self.error("expected an import path"));
                        };
                        let alias = alias
                            .unwrap_or_else(|| path.rsplit('/').next().unwrap_or(&path).to_owned());
                        file.imports.push((alias, path));
                        if !group {
                            break;
                        }
                    }
                }
                "type" => {
                    self.next();
                    if self.is("(") {
                        self.skip_group()?;
                    } else {
                        self.ident()?;
                        self.ty()?;
                    }
                }
                "var" | "const" => {
                    self.next();
                    for (names, _, values) in self.var_specs()? {
                        for (name, value) in names.into_iter().zip(values) {
                            file.values.push((name, value));
                        }
                    }
                }
                "func" => {
                    self.next();
                    if self.is("(") {
                        // A method: not used by the tests' bodies.
                        self.skip_group()?;
                        self.ident()?;
                        self.params()?;
                        self.results()?;
                        self.skip_group()?;
                    } else {
                        let name = self.ident()?;
                        let params = self.params()?;
                        let results = self.results()?;
                        let body = self.block()?;
                        file.funcs.push(FuncDecl {
                            name,
                            params,
                            results,
                            body,
                        });
                    }
                }
                _ => return Err(self.error("expected a declaration")),
            }
            self.skip_semis();
        }
        Ok(file)
    }

    /// `var`/`const` specs, one or a parenthesised group: names, type,
    /// values.
    fn var_specs(&mut self) -> R<Vec<VarSpec>> {
        let mut specs = Vec::new();
        let group = self.eat("(");
        loop {
            if group {
                self.skip_semis();
                if self.eat(")") {
                    break;
                }
            }
            let mut names = vec![self.ident()?];
            while self.eat(",") {
                names.push(self.ident()?);
            }
            let ty = if !self.is("=") && !matches!(self.peek(), Tok::Semi) && !self.is(")") {
                Some(self.ty()?)
            } else {
                None
            };
            let values = if self.eat("=") {
                self.expr_list()?
            } else {
                Vec::new()
            };
            specs.push((names, ty, values));
            if !group {
                break;
            }
        }
        Ok(specs)
    }

    /// Parameter names (types read and dropped).
    fn params(&mut self) -> R<Vec<String>> {
        self.expect("(")?;
        let mut names = Vec::new();
        let mut pending: Vec<String> = Vec::new();
        while !self.eat(")") {
            // `a, b T`, `a T`, `T` alone, `...T`.
            if let (Tok::Ident(name), next) = (self.peek().clone(), self.peek_at(1).clone()) {
                if matches!(next, Tok::Op(",")) {
                    self.next();
                    self.next();
                    pending.push(name);
                    continue;
                }
                if !matches!(next, Tok::Op(")") | Tok::Op(".")) {
                    self.next();
                    self.eat("...");
                    self.ty()?;
                    names.append(&mut pending);
                    names.push(name);
                    self.eat(",");
                    continue;
                }
            }
            self.eat("...");
            self.ty()?;
            pending.clear();
            self.eat(",");
        }
        // Names only (`func(a, b)` would be types; not in the suite).
        names.append(&mut pending);
        Ok(names)
    }

    fn results(&mut self) -> R<Vec<String>> {
        if self.is("(") {
            return self.params();
        }
        if self.is("{") || matches!(self.peek(), Tok::Semi) {
            return Ok(Vec::new());
        }
        self.ty()?;
        Ok(Vec::new())
    }

    pub fn ty(&mut self) -> R<Type> {
        if self.eat("*") {
            return Ok(Type::Pointer(Box::new(self.ty()?)));
        }
        if self.eat("[") {
            if self.eat("]") {
                return Ok(Type::Slice(Box::new(self.ty()?)));
            }
            // `[N]T`, `[...]T`
            while !self.eat("]") {
                self.next();
            }
            return Ok(Type::Array(Box::new(self.ty()?)));
        }
        if self.eat("(") {
            let t = self.ty()?;
            self.expect(")")?;
            return Ok(t);
        }
        match self.peek().clone() {
            Tok::Ident(k) if k == "map" => {
                self.next();
                self.expect("[")?;
                let key = self.ty()?;
                self.expect("]")?;
                let value = self.ty()?;
                let _ = key;
                Ok(Type::Map(Box::new(value)))
            }
            Tok::Ident(k) if k == "func" => {
                self.next();
                self.params()?;
                self.results()?;
                Ok(Type::Func)
            }
            Tok::Ident(k) if k == "chan" => {
                self.next();
                self.ty()?;
                Ok(Type::Other)
            }
            Tok::Ident(k) if k == "interface" => {
                self.next();
                self.skip_group()?;
                Ok(Type::Other)
            }
            Tok::Ident(k) if k == "struct" => {
                self.next();
                self.expect("{")?;
                let mut fields = Vec::new();
                loop {
                    self.skip_semis();
                    if self.eat("}") {
                        break;
                    }
                    let mut names = vec![self.ident()?];
                    while self.eat(",") {
                        names.push(self.ident()?);
                    }
                    if matches!(self.peek(), Tok::Semi) || self.is("}") {
                        // An embedded field.
                        fields.append(&mut names);
                        continue;
                    }
                    self.ty()?;
                    if matches!(self.peek(), Tok::Str(_)) {
                        self.next();
                    }
                    fields.append(&mut names);
                }
                Ok(Type::Struct(fields))
            }
            Tok::Ident(name) => {
                self.next();
                if self.is(".") {
                    if let Tok::Ident(sel) = self.peek_at(1).clone() {
                        self.next();
                        self.next();
                        return Ok(Type::Named(format!("{name}.{sel}")));
                    }
                }
                Ok(Type::Named(name))
            }
            _ => Err(self.error("expected a type")),
        }
    }

    pub fn block(&mut self) -> R<Block> {
        let saved = self.no_literal;
        self.no_literal = false;
        self.expect("{")?;
        let mut stmts = Vec::new();
        loop {
            self.skip_semis();
            if self.eat("}") {
                break;
            }
            stmts.push(self.stmt()?);
            if !self.is("}") && !matches!(self.peek(), Tok::Semi) {
                return Err(self.error("expected the end of a statement"));
            }
        }
        self.no_literal = saved;
        Ok(stmts)
    }

    fn stmt(&mut self) -> R<Stmt> {
        if let Tok::Ident(kw) = self.peek().clone() {
            match kw.as_str() {
                "if" => return self.if_stmt(),
                "for" => return self.for_stmt(),
                "switch" => return self.switch_stmt(),
                "return" => {
                    self.next();
                    if matches!(self.peek(), Tok::Semi) || self.is("}") {
                        return Ok(Stmt::Return(Vec::new()));
                    }
                    return Ok(Stmt::Return(self.expr_list()?));
                }
                "break" => {
                    self.next();
                    return Ok(Stmt::Break);
                }
                "continue" => {
                    self.next();
                    return Ok(Stmt::Continue);
                }
                "defer" => {
                    self.next();
                    return Ok(Stmt::Defer(self.expr()?));
                }
                // A goroutine runs at once, to its end.
                "go" => {
                    self.next();
                    return Ok(Stmt::Expr(self.expr()?));
                }
                "var" | "const" => {
                    self.next();
                    let mut defines = Vec::new();
                    for (names, ty, values) in self.var_specs()? {
                        let values = if values.is_empty() {
                            names
                                .iter()
                                .map(|_| zero_of(ty.as_ref()))
                                .collect::<Vec<_>>()
                        } else {
                            values
                        };
                        defines.push(Stmt::Define(names, values));
                    }
                    return Ok(if defines.len() == 1 {
                        defines.remove(0)
                    } else {
                        Stmt::Multi(defines)
                    });
                }
                "type" => {
                    self.next();
                    self.ident()?;
                    self.ty()?;
                    return Ok(Stmt::Empty);
                }
                _ => {}
            }
        }
        if self.is("{") {
            return Ok(Stmt::Block(self.block()?));
        }
        self.simple_stmt()
    }

    fn simple_stmt(&mut self) -> R<Stmt> {
        let line = self.line();
        let lhs = self.expr_list()?;
        if self.eat(":=") {
            let names = lhs
                .into_iter()
                .map(|e| match e {
                    Expr::Ident(n) => Ok(n),
                    other => Err(format!("line {line}: cannot define {other:?}")),
                })
                .collect::<R<Vec<_>>>()?;
            if self.is_kw("range") {
                return Err(format!("line {line}: range outside for"));
            }
            return Ok(Stmt::Define(names, self.expr_list()?));
        }
        for op in ["=", "+=", "-=", "*=", "/=", "|=", "&="] {
            if self.eat(op) {
                return Ok(Stmt::Assign(lhs, op, self.expr_list()?));
            }
        }
        if self.eat("++") {
            return Ok(Stmt::IncDec(one(lhs)?, true));
        }
        if self.eat("<-") {
            // A channel send: the value is evaluated, nothing waits.
            return Ok(Stmt::Expr(self.expr()?));
        }
        if self.eat("--") {
            return Ok(Stmt::IncDec(one(lhs)?, false));
        }
        Ok(Stmt::Expr(one(lhs)?))
    }

    fn if_stmt(&mut self) -> R<Stmt> {
        self.next();
        let saved = self.no_literal;
        self.no_literal = true;
        let first = self.simple_stmt()?;
        let (init, cond) = if matches!(self.peek(), Tok::Semi) {
            self.next();
            let cond = self.expr()?;
            (Some(Box::new(first)), cond)
        } else {
            match first {
                Stmt::Expr(e) => (None, e),
                _ => return Err(self.error("expected a condition")),
            }
        };
        self.no_literal = saved;
        let then = self.block()?;
        let otherwise = if self.is_kw("else") {
            self.next();
            if self.is_kw("if") {
                Some(Box::new(self.if_stmt()?))
            } else {
                Some(Box::new(Stmt::Block(self.block()?)))
            }
        } else {
            None
        };
        Ok(Stmt::If {
            init,
            cond,
            then,
            otherwise,
        })
    }

    fn for_stmt(&mut self) -> R<Stmt> {
        self.next();
        let saved = self.no_literal;
        self.no_literal = true;
        if self.is("{") {
            self.no_literal = saved;
            return Ok(Stmt::For {
                init: None,
                cond: None,
                post: None,
                body: self.block()?,
            });
        }
        if self.is_kw("range") {
            self.next();
            let expr = self.expr()?;
            self.no_literal = saved;
            return Ok(Stmt::Range {
                key: None,
                value: None,
                expr,
                body: self.block()?,
            });
        }
        // `k, v := range x` / `k := range x` / `k, v = range x`
        let start = self.pos;
        let mut names = Vec::new();
        while let Tok::Ident(n) = self.peek().clone() {
            self.next();
            names.push(n);
            if !self.eat(",") {
                break;
            }
        }
        if (self.is(":=") || self.is("="))
            && matches!(self.peek_at(1), Tok::Ident(k) if k == "range")
        {
            self.next();
            self.next();
            let expr = self.expr()?;
            self.no_literal = saved;
            let mut names = names.into_iter().map(|n| (n != "_").then_some(n));
            return Ok(Stmt::Range {
                key: names.next().flatten(),
                value: names.next().flatten(),
                expr,
                body: self.block()?,
            });
        }
        self.pos = start;
        let init = if matches!(self.peek(), Tok::Semi) {
            None
        } else {
            Some(Box::new(self.simple_stmt()?))
        };
        if self.is("{") {
            // `for cond {`
            self.no_literal = saved;
            let cond = match init.map(|b| *b) {
                Some(Stmt::Expr(e)) => Some(e),
                _ => return Err(self.error("expected a loop condition")),
            };
            return Ok(Stmt::For {
                init: None,
                cond,
                post: None,
                body: self.block()?,
            });
        }
        if !matches!(self.next(), Tok::Semi) {
            return Err(self.error("expected ; in for"));
        }
        let cond = if matches!(self.peek(), Tok::Semi) {
            None
        } else {
            Some(self.expr()?)
        };
        if !matches!(self.next(), Tok::Semi) {
            return Err(self.error("expected ; in for"));
        }
        let post = if self.is("{") {
            None
        } else {
            Some(Box::new(self.simple_stmt()?))
        };
        self.no_literal = saved;
        Ok(Stmt::For {
            init,
            cond,
            post,
            body: self.block()?,
        })
    }

    fn switch_stmt(&mut self) -> R<Stmt> {
        self.next();
        let saved = self.no_literal;
        self.no_literal = true;
        let mut init = None;
        let mut tag = None;
        if !self.is("{") {
            let first = self.simple_stmt()?;
            if matches!(self.peek(), Tok::Semi) {
                self.next();
                init = Some(Box::new(first));
                if !self.is("{") {
                    tag = Some(match self.simple_stmt()? {
                        Stmt::Expr(e) => e,
                        _ => return Err(self.error("type switches are not read")),
                    });
                }
            } else {
                tag = Some(match first {
                    Stmt::Expr(e) => e,
                    _ => return Err(self.error("type switches are not read")),
                });
            }
        }
        self.no_literal = saved;
        self.expect("{")?;
        let mut cases = Vec::new();
        loop {
            self.skip_semis();
            if self.eat("}") {
                break;
            }
            let values = if self.is_kw("default") {
                self.next();
                None
            } else if self.is_kw("case") {
                self.next();
                Some(self.expr_list()?)
            } else {
                return Err(self.error("expected case"));
            };
            self.expect(":")?;
            let mut body = Vec::new();
            loop {
                self.skip_semis();
                if self.is("}") || self.is_kw("case") || self.is_kw("default") {
                    break;
                }
                body.push(self.stmt()?);
            }
            cases.push((values, body));
        }
        Ok(Stmt::Switch { init, tag, cases })
    }

    pub fn expr_list(&mut self) -> R<Vec<Expr>> {
        let mut list = vec![self.expr()?];
        while self.eat(",") {
            list.push(self.expr()?);
        }
        Ok(list)
    }

    pub fn expr(&mut self) -> R<Expr> {
        self.binary(1)
    }

    fn binary(&mut self, min: u8) -> R<Expr> {
        let mut left = self.unary()?;
        while let Tok::Op(op) = self.peek().clone() {
            let prec = match op {
                "||" => 1,
                "&&" => 2,
                "==" | "!=" | "<" | "<=" | ">" | ">=" => 3,
                "+" | "-" | "|" | "^" => 4,
                "*" | "/" | "%" | "<<" | ">>" | "&" | "&^" => 5,
                _ => break,
            };
            if prec < min {
                break;
            }
            self.next();
            let right = self.binary(prec + 1)?;
            left = Expr::Binary(op, Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn unary(&mut self) -> R<Expr> {
        for op in ["!", "-", "&", "*", "^", "<-", "+"] {
            if self.is(op) {
                self.next();
                let inner = self.unary()?;
                let op = match op {
                    "!" => "!",
                    "-" => "-",
                    "&" => "&",
                    "*" => "*",
                    "+" => "+",
                    "^" => "^",
                    _ => "<-",
                };
                return Ok(Expr::Unary(op, Box::new(inner)));
            }
        }
        self.postfix()
    }

    fn postfix(&mut self) -> R<Expr> {
        let mut e = self.operand()?;
        loop {
            if self.eat(".") {
                if self.eat("(") {
                    // A type assertion `x.(T)`.
                    self.ty()?;
                    self.expect(")")?;
                    e = Expr::TypeAssert(Box::new(e));
                    continue;
                }
                e = Expr::Selector(Box::new(e), self.ident()?);
                continue;
            }
            if self.is("(") {
                self.next();
                let saved = self.no_literal;
                self.no_literal = false;
                let mut args = Vec::new();
                let mut spread = false;
                loop {
                    self.skip_semis();
                    if self.eat(")") {
                        break;
                    }
                    args.push(self.expr()?);
                    if self.eat("...") {
                        spread = true;
                    }
                    self.skip_semis();
                    if !self.eat(",") {
                        self.skip_semis();
                        self.expect(")")?;
                        break;
                    }
                }
                self.no_literal = saved;
                e = Expr::Call {
                    func: Box::new(e),
                    args,
                    spread,
                };
                continue;
            }
            if self.is("[") {
                self.next();
                let saved = self.no_literal;
                self.no_literal = false;
                if self.eat(":") {
                    let hi = if self.is("]") {
                        None
                    } else {
                        Some(Box::new(self.expr()?))
                    };
                    self.expect("]")?;
                    e = Expr::Slice(Box::new(e), None, hi);
                } else {
                    let index = self.expr()?;
                    if self.eat(":") {
                        let hi = if self.is("]") {
                            None
                        } else {
                            Some(Box::new(self.expr()?))
                        };
                        self.expect("]")?;
                        e = Expr::Slice(Box::new(e), Some(Box::new(index)), hi);
                    } else {
                        self.expect("]")?;
                        e = Expr::Index(Box::new(e), Box::new(index));
                    }
                }
                self.no_literal = saved;
                continue;
            }
            if self.is("{") && !self.no_literal && could_be_type(&e) {
                let ty = expr_type(&e);
                e = self.composite(Some(ty))?;
                continue;
            }
            break;
        }
        Ok(e)
    }

    fn operand(&mut self) -> R<Expr> {
        match self.peek().clone() {
            Tok::Str(s) => {
                self.next();
                Ok(Expr::Str(s))
            }
            Tok::Int(i) => {
                self.next();
                Ok(Expr::Int(i))
            }
            Tok::Float(x) => {
                self.next();
                Ok(Expr::Float(x))
            }
            Tok::Char(c) => {
                self.next();
                Ok(Expr::Int(c as i64))
            }
            Tok::Op("(") => {
                self.next();
                let saved = self.no_literal;
                self.no_literal = false;
                // `(*T)(x)` is a conversion.
                let e = if self.is("*") && matches!(self.peek_at(1), Tok::Ident(_)) {
                    let start = self.pos;
                    match self.ty() {
                        Ok(t) if self.is(")") => Expr::Type(Type::Pointer(Box::new(t))),
                        _ => {
                            self.pos = start;
                            self.expr()?
                        }
                    }
                } else {
                    self.expr()?
                };
                self.no_literal = saved;
                self.expect(")")?;
                Ok(e)
            }
            Tok::Op("[") => {
                let ty = self.ty()?;
                if self.is("{") {
                    self.composite(Some(ty))
                } else {
                    Ok(Expr::Type(ty))
                }
            }
            Tok::Op("{") => self.composite(None),
            Tok::Ident(k) if k == "func" => {
                self.next();
                let params = self.params()?;
                self.results()?;
                let body = self.block()?;
                Ok(Expr::Func { params, body })
            }
            Tok::Ident(k) if k == "map" || k == "struct" || k == "chan" => {
                let ty = self.ty()?;
                if self.is("{") {
                    self.composite(Some(ty))
                } else {
                    Ok(Expr::Type(ty))
                }
            }
            Tok::Ident(name) => {
                self.next();
                Ok(Expr::Ident(name))
            }
            _ => Err(self.error("expected an expression")),
        }
    }

    fn composite(&mut self, ty: Option<Type>) -> R<Expr> {
        self.expect("{")?;
        let saved = self.no_literal;
        self.no_literal = false;
        let mut elems = Vec::new();
        loop {
            self.skip_semis();
            if self.eat("}") {
                break;
            }
            let first = if self.is("{") {
                self.composite(None)?
            } else {
                self.expr()?
            };
            if self.eat(":") {
                self.skip_semis();
                let value = if self.is("{") {
                    self.composite(None)?
                } else {
                    self.expr()?
                };
                elems.push((Some(first), value));
            } else {
                elems.push((None, first));
            }
            self.skip_semis();
            if !self.eat(",") {
                self.skip_semis();
                self.expect("}")?;
                break;
            }
        }
        self.no_literal = saved;
        Ok(Expr::Composite { ty, elems })
    }
}

fn one(mut list: Vec<Expr>) -> R<Expr> {
    if list.len() == 1 {
        Ok(list.remove(0))
    } else {
        Err("expected one expression".into())
    }
}

fn could_be_type(e: &Expr) -> bool {
    match e {
        Expr::Ident(_) | Expr::Type(_) => true,
        Expr::Selector(inner, _) => matches!(**inner, Expr::Ident(_)),
        _ => false,
    }
}

fn expr_type(e: &Expr) -> Type {
    match e {
        Expr::Ident(n) => Type::Named(n.clone()),
        Expr::Selector(inner, sel) => match &**inner {
            Expr::Ident(p) => Type::Named(format!("{p}.{sel}")),
            _ => Type::Other,
        },
        Expr::Type(t) => t.clone(),
        _ => Type::Other,
    }
}

/// The zero value of a declared type, as an expression.
fn zero_of(ty: Option<&Type>) -> Expr {
    match ty {
        Some(Type::Named(n)) if n == "string" => Expr::Str(String::new()),
        Some(Type::Named(n)) if n.starts_with("int") || n.starts_with("uint") => Expr::Int(0),
        Some(Type::Named(n)) if n == "bool" => Expr::Ident("false".into()),
        Some(Type::Struct(_)) | Some(Type::Named(_)) => Expr::Composite {
            ty: ty.cloned(),
            elems: Vec::new(),
        },
        _ => Expr::Ident("nil".into()),
    }
}
