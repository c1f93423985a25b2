//! Runs a conformance test's Go body: values, scopes, control flow, and
//! the standard library the bodies use. The suite's own helpers
//! (`kubernetes.*`, `http.*`, `tls.*`, the round tripper) are the
//! caller's [`Natives`]: each is an assertion against cutover's import
//! or its live traffic.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc as Rc;

use super::golang::{Block, Expr, FuncDecl, Stmt, Type};

#[derive(Clone)]
pub enum V {
    Nil,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    List(Vec<V>),
    /// Insertion-ordered.
    Map(Vec<(V, V)>),
    /// A struct: its type's last name and its fields.
    Struct(String, BTreeMap<String, V>),
    Func(Rc<Closure>),
    Tuple(Vec<V>),
    /// Something the suite has and we do not model (a client, a context):
    /// only passed along.
    Opaque(String),
}

pub struct Closure {
    pub params: Vec<String>,
    pub results: Vec<String>,
    pub body: Block,
    pub env: Vec<HashMap<String, V>>,
    pub file: Rc<Imports>,
}

impl fmt::Debug for V {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            V::Nil => write!(f, "nil"),
            V::Bool(b) => write!(f, "{b}"),
            V::Int(i) => write!(f, "{i}"),
            V::Float(x) => write!(f, "{x}"),
            V::Str(s) => write!(f, "{s:?}"),
            V::List(items) => f.debug_list().entries(items).finish(),
            V::Map(pairs) => f
                .debug_map()
                .entries(pairs.iter().map(|(k, v)| (k, v)))
                .finish(),
            V::Struct(ty, fields) => {
                write!(f, "{ty}")?;
                f.debug_map().entries(fields.iter()).finish()
            }
            V::Func(_) => write!(f, "func"),
            V::Tuple(items) => f.debug_list().entries(items).finish(),
            V::Opaque(what) => write!(f, "<{what}>"),
        }
    }
}

impl V {
    pub fn str(&self) -> String {
        match self {
            V::Str(s) => s.clone(),
            V::Nil => String::new(),
            V::Int(i) => i.to_string(),
            V::Float(x) => x.to_string(),
            V::Bool(b) => b.to_string(),
            other => format!("{other:?}"),
        }
    }

    pub fn int(&self) -> i64 {
        match self {
            V::Int(i) => *i,
            V::Float(x) => *x as i64,
            _ => 0,
        }
    }

    pub fn float(&self) -> f64 {
        match self {
            V::Int(i) => *i as f64,
            V::Float(x) => *x,
            _ => 0.0,
        }
    }

    pub fn truthy(&self) -> bool {
        matches!(self, V::Bool(true))
    }

    pub fn list(&self) -> Vec<V> {
        match self {
            V::List(items) => items.clone(),
            V::Nil => Vec::new(),
            other => vec![other.clone()],
        }
    }

    /// A field of a struct (embedded structs searched too), or nil.
    pub fn field(&self, name: &str) -> V {
        match self {
            V::Struct(_, fields) => {
                if let Some(v) = fields.get(name) {
                    return v.clone();
                }
                for v in fields.values() {
                    if let V::Struct(..) = v {
                        let inner = v.field(name);
                        if !matches!(inner, V::Nil) {
                            return inner;
                        }
                    }
                }
                V::Nil
            }
            V::Map(_) => self.get(&V::Str(name.into())).unwrap_or(V::Nil),
            _ => V::Nil,
        }
    }

    pub fn get(&self, key: &V) -> Option<V> {
        match self {
            V::Map(pairs) => pairs
                .iter()
                .find(|(k, _)| go_eq(k, key))
                .map(|(_, v)| v.clone()),
            _ => None,
        }
    }

    pub fn map_entries(&self) -> Vec<(V, V)> {
        match self {
            V::Map(pairs) => pairs.clone(),
            _ => Vec::new(),
        }
    }

    pub fn is_nil(&self) -> bool {
        match self {
            V::Nil => true,
            V::List(items) => items.is_empty(),
            V::Map(pairs) => pairs.is_empty(),
            _ => false,
        }
    }
}

/// Go's `==`, with a zero value equal to nil (fields the tests left out
/// read as nil here).
pub fn go_eq(a: &V, b: &V) -> bool {
    match (a, b) {
        (V::Nil, V::Nil) => true,
        (V::Nil, other) | (other, V::Nil) => match other {
            V::Str(s) => s.is_empty(),
            V::Int(0) | V::Bool(false) => true,
            V::Float(x) => *x == 0.0,
            V::List(l) => l.is_empty(),
            V::Map(m) => m.is_empty(),
            V::Struct(_, f) => f.values().all(|v| go_eq(v, &V::Nil)),
            _ => false,
        },
        (V::Bool(x), V::Bool(y)) => x == y,
        (V::Int(x), V::Int(y)) => x == y,
        (V::Int(_) | V::Float(_), V::Int(_) | V::Float(_)) => a.float() == b.float(),
        (V::Str(x), V::Str(y)) => x == y,
        (V::List(x), V::List(y)) => x.len() == y.len() && x.iter().zip(y).all(|(a, b)| go_eq(a, b)),
        (V::Struct(_, x), V::Struct(_, y)) => x
            .keys()
            .chain(y.keys())
            .all(|k| go_eq(x.get(k).unwrap_or(&V::Nil), y.get(k).unwrap_or(&V::Nil))),
        (V::Opaque(x), V::Opaque(y)) => x == y,
        _ => false,
    }
}

/// The import paths of one file, by the name the file uses.
#[derive(Debug, Default)]
pub struct Imports {
    pub by_alias: HashMap<String, String>,
}

impl Imports {
    /// The package a name refers to, as one canonical word (`v1` for the
    /// Gateway API's versions, `metav1`, `kubernetes`, `http`…).
    pub fn package(&self, alias: &str) -> Option<String> {
        let path = self.by_alias.get(alias)?;
        Some(canonical_package(path))
    }
}

pub fn canonical_package(path: &str) -> String {
    if path.contains("gateway-api/apis") || path.contains("gateway-api/apisx") {
        return "v1".into();
    }
    if path == "k8s.io/apimachinery/pkg/apis/meta/v1" {
        return "metav1".into();
    }
    if path == "k8s.io/api/core/v1" {
        return "corev1".into();
    }
    path.rsplit('/').next().unwrap_or(path).to_owned()
}

/// A deferred call and the scopes it was deferred in.
type Deferred = (Expr, Vec<HashMap<String, V>>);

pub enum Flow {
    Normal,
    Break,
    Continue,
    Return(V),
    /// `t.Fatal`, `t.FailNow`, `require.*`: ends the (sub)test.
    Fatal(String),
}

/// What the interpreter cannot do alone.
pub trait Natives {
    /// `pkg.Func(args)`, pkg canonical. `None`: not known.
    fn call(
        &mut self,
        interp: &mut Interp,
        pkg: &str,
        name: &str,
        args: Vec<V>,
    ) -> Option<Result<V, Flow>>;
    /// `recv.Method(args)` on a value. `None`: not known.
    fn method(
        &mut self,
        interp: &mut Interp,
        recv: &V,
        name: &str,
        args: Vec<V>,
    ) -> Option<Result<V, Flow>>;
    /// A package-level constant or variable (`confsuite.InfrastructureNamespace`).
    fn constant(&self, pkg: &str, name: &str) -> Option<V>;
    /// `t.Error*`: a failure that does not stop the test.
    fn error(&mut self, message: String);
}

pub struct Interp {
    pub scopes: Vec<HashMap<String, V>>,
    pub file: Rc<Imports>,
    /// The package's functions and top-level values, by name.
    pub funcs: Rc<HashMap<String, (FuncDecl, Rc<Imports>)>>,
    pub globals: Rc<HashMap<String, (Expr, Rc<Imports>)>>,
    /// Calls of functions nobody knows: reported, since a test that
    /// depends on one is not held to everything it says.
    pub unknown: Vec<String>,
    pub steps: u64,
    /// Per running function: its deferred calls and their scopes.
    defers: Vec<Vec<Deferred>>,
}

type R = Result<V, Flow>;

const STEP_LIMIT: u64 = 5_000_000;

impl Interp {
    pub fn new(
        file: Rc<Imports>,
        funcs: Rc<HashMap<String, (FuncDecl, Rc<Imports>)>>,
        globals: Rc<HashMap<String, (Expr, Rc<Imports>)>>,
    ) -> Interp {
        Interp {
            scopes: vec![HashMap::new()],
            file,
            funcs,
            globals,
            unknown: Vec::new(),
            steps: 0,
            defers: Vec::new(),
        }
    }

    fn lookup(&self, name: &str) -> Option<V> {
        self.scopes.iter().rev().find_map(|s| s.get(name).cloned())
    }

    fn define(&mut self, name: &str, value: V) {
        if name == "_" {
            return;
        }
        if let Some(scope) = self.scopes.last_mut() {
            scope.insert(name.to_owned(), value);
        }
    }

    fn set(&mut self, name: &str, value: V) {
        for scope in self.scopes.iter_mut().rev() {
            if let Some(slot) = scope.get_mut(name) {
                *slot = value;
                return;
            }
        }
        self.define(name, value);
    }

    /// Calls a function value with arguments.
    pub fn call_value(&mut self, f: &V, args: Vec<V>, natives: &mut dyn Natives) -> R {
        if matches!(f, V::Opaque(what) if what == "noop") {
            return Ok(V::Nil);
        }
        let V::Func(closure) = f else {
            // A function the natives returned (the mirror check's wait).
            return match natives.method(self, f, "()", args) {
                Some(r) => r,
                None => Err(Flow::Fatal(format!("calling a non-function {f:?}"))),
            };
        };
        let saved_scopes = std::mem::replace(&mut self.scopes, closure.env.clone());
        let saved_file = std::mem::replace(&mut self.file, Rc::clone(&closure.file));
        self.scopes.push(HashMap::new());
        self.defers.push(Vec::new());
        for (i, p) in closure.params.iter().enumerate() {
            let v = args.get(i).cloned().unwrap_or(V::Nil);
            self.define(p, v);
        }
        for r in &closure.results {
            self.define(r, V::Nil);
        }
        let mut flow = self.block_flow(&closure.body, natives);
        // Deferred calls, last first, each in the scopes it was deferred in.
        let deferred = self.defers.pop().unwrap_or_default();
        for (call, scopes) in deferred.into_iter().rev() {
            let here = std::mem::replace(&mut self.scopes, scopes);
            let result = self.expr(&call, natives);
            self.scopes = here;
            if let (Err(Flow::Fatal(m)), false) = (result, matches!(flow, Flow::Fatal(_))) {
                flow = Flow::Fatal(m);
            }
        }
        let named: Vec<V> = closure
            .results
            .iter()
            .map(|r| self.lookup(r).unwrap_or(V::Nil))
            .collect();
        self.scopes = saved_scopes;
        self.file = saved_file;
        match flow {
            Flow::Return(v) => Ok(
                if matches!(&v, V::Tuple(t) if t.is_empty()) && !named.is_empty() {
                    tuple(named)
                } else {
                    v
                },
            ),
            Flow::Fatal(m) => Err(Flow::Fatal(m)),
            _ => Ok(if named.is_empty() {
                V::Tuple(Vec::new())
            } else {
                tuple(named)
            }),
        }
    }

    pub fn block_flow(&mut self, block: &Block, natives: &mut dyn Natives) -> Flow {
        self.scopes.push(HashMap::new());
        let mut flow = Flow::Normal;
        for stmt in block {
            flow = self.stmt(stmt, natives);
            if !matches!(flow, Flow::Normal) {
                break;
            }
        }
        self.scopes.pop();
        flow
    }

    fn stmt(&mut self, stmt: &Stmt, natives: &mut dyn Natives) -> Flow {
        self.steps += 1;
        if self.steps > STEP_LIMIT {
            return Flow::Fatal("the interpreter's step limit was reached".into());
        }
        macro_rules! val {
            ($e:expr) => {
                match $e {
                    Ok(v) => v,
                    Err(flow) => return flow,
                }
            };
        }
        match stmt {
            Stmt::Empty => Flow::Normal,
            Stmt::Expr(e) => {
                val!(self.expr(e, natives));
                Flow::Normal
            }
            Stmt::Define(names, values) => {
                let vals = val!(self.values(values, names.len(), natives));
                for (n, v) in names.iter().zip(vals) {
                    self.define(n, v);
                }
                Flow::Normal
            }
            Stmt::Assign(targets, op, values) => {
                let vals = val!(self.values(values, targets.len(), natives));
                for (target, v) in targets.iter().zip(vals) {
                    let v = if *op == "=" {
                        v
                    } else {
                        let old = val!(self.expr(target, natives));
                        val!(binary(&op[..1], &old, &v))
                    };
                    val!(self.assign(target, v, natives));
                }
                Flow::Normal
            }
            Stmt::IncDec(target, up) => {
                let old = val!(self.expr(target, natives));
                let new = V::Int(old.int() + if *up { 1 } else { -1 });
                val!(self.assign(target, new, natives));
                Flow::Normal
            }
            Stmt::If {
                init,
                cond,
                then,
                otherwise,
            } => {
                self.scopes.push(HashMap::new());
                if let Some(init) = init {
                    let f = self.stmt(init, natives);
                    if !matches!(f, Flow::Normal) {
                        self.scopes.pop();
                        return f;
                    }
                }
                let c = match self.expr(cond, natives) {
                    Ok(c) => c,
                    Err(f) => {
                        self.scopes.pop();
                        return f;
                    }
                };
                let flow = if c.truthy() {
                    self.block_flow(then, natives)
                } else if let Some(other) = otherwise {
                    self.stmt(other, natives)
                } else {
                    Flow::Normal
                };
                self.scopes.pop();
                flow
            }
            Stmt::Block(b) => self.block_flow(b, natives),
            Stmt::Multi(list) => {
                for s in list {
                    let f = self.stmt(s, natives);
                    if !matches!(f, Flow::Normal) {
                        return f;
                    }
                }
                Flow::Normal
            }
            Stmt::For {
                init,
                cond,
                post,
                body,
            } => {
                self.scopes.push(HashMap::new());
                if let Some(init) = init {
                    let f = self.stmt(init, natives);
                    if !matches!(f, Flow::Normal) {
                        self.scopes.pop();
                        return f;
                    }
                }
                let mut result = Flow::Normal;
                let mut rounds = 0u32;
                loop {
                    rounds += 1;
                    if rounds > 100_000 {
                        result = Flow::Fatal("a loop ran 100 000 times".into());
                        break;
                    }
                    if let Some(cond) = cond {
                        match self.expr(cond, natives) {
                            Ok(c) if c.truthy() => {}
                            Ok(_) => break,
                            Err(f) => {
                                result = f;
                                break;
                            }
                        }
                    }
                    match self.block_flow(body, natives) {
                        Flow::Break => break,
                        Flow::Normal | Flow::Continue => {}
                        other => {
                            result = other;
                            break;
                        }
                    }
                    if let Some(post) = post {
                        let f = self.stmt(post, natives);
                        if !matches!(f, Flow::Normal) {
                            result = f;
                            break;
                        }
                    }
                }
                self.scopes.pop();
                result
            }
            Stmt::Range {
                key,
                value,
                expr,
                body,
            } => {
                let over = val!(self.expr(expr, natives));
                let items: Vec<(V, V)> = match &over {
                    V::List(items) => items
                        .iter()
                        .enumerate()
                        .map(|(i, v)| (V::Int(i as i64), v.clone()))
                        .collect(),
                    V::Map(pairs) => pairs.clone(),
                    V::Int(n) => (0..*n).map(|i| (V::Int(i), V::Nil)).collect(),
                    V::Str(s) => s
                        .chars()
                        .enumerate()
                        .map(|(i, c)| (V::Int(i as i64), V::Int(c as i64)))
                        .collect(),
                    V::Nil => Vec::new(),
                    other => return Flow::Fatal(format!("range over {other:?}")),
                };
                for (k, v) in items {
                    self.scopes.push(HashMap::new());
                    if let Some(key) = key {
                        self.define(key, k);
                    }
                    if let Some(value) = value {
                        self.define(value, v);
                    }
                    let flow = self.block_flow(body, natives);
                    self.scopes.pop();
                    match flow {
                        Flow::Break => break,
                        Flow::Normal | Flow::Continue => {}
                        other => return other,
                    }
                }
                Flow::Normal
            }
            Stmt::Switch { init, tag, cases } => {
                self.scopes.push(HashMap::new());
                if let Some(init) = init {
                    let f = self.stmt(init, natives);
                    if !matches!(f, Flow::Normal) {
                        self.scopes.pop();
                        return f;
                    }
                }
                let tag = match tag {
                    Some(t) => match self.expr(t, natives) {
                        Ok(v) => Some(v),
                        Err(f) => {
                            self.scopes.pop();
                            return f;
                        }
                    },
                    None => None,
                };
                let mut chosen = None;
                'cases: for (i, (values, _)) in cases.iter().enumerate() {
                    let Some(values) = values else { continue };
                    for v in values {
                        let v = match self.expr(v, natives) {
                            Ok(v) => v,
                            Err(f) => {
                                self.scopes.pop();
                                return f;
                            }
                        };
                        let hit = match &tag {
                            Some(t) => go_eq(t, &v),
                            None => v.truthy(),
                        };
                        if hit {
                            chosen = Some(i);
                            break 'cases;
                        }
                    }
                }
                let chosen = chosen.or_else(|| cases.iter().position(|(v, _)| v.is_none()));
                let flow = match chosen {
                    Some(i) => match self.block_flow(&cases[i].1, natives) {
                        Flow::Break => Flow::Normal,
                        other => other,
                    },
                    None => Flow::Normal,
                };
                self.scopes.pop();
                flow
            }
            Stmt::Return(values) => {
                let vals = val!(values
                    .iter()
                    .map(|e| self.expr(e, natives))
                    .collect::<Result<Vec<_>, _>>());
                Flow::Return(tuple(vals))
            }
            Stmt::Break => Flow::Break,
            Stmt::Continue => Flow::Continue,
            Stmt::Defer(call) => {
                let scopes = self.scopes.clone();
                match self.defers.last_mut() {
                    Some(list) => list.push((call.clone(), scopes)),
                    None => {
                        val!(self.expr(call, natives));
                    }
                }
                Flow::Normal
            }
        }
    }

    /// `n` values from a list of expressions (a call returning a tuple
    /// spreads).
    fn values(
        &mut self,
        exprs: &[Expr],
        n: usize,
        natives: &mut dyn Natives,
    ) -> Result<Vec<V>, Flow> {
        if exprs.len() == 1 && n > 1 {
            let v = self.expr(&exprs[0], natives)?;
            return Ok(match v {
                V::Tuple(items) if items.len() == n => items,
                // `v, ok := m[k]`
                other => {
                    let ok = !matches!(other, V::Nil);
                    let mut out = vec![other, V::Bool(ok)];
                    out.resize(n, V::Nil);
                    out
                }
            });
        }
        exprs
            .iter()
            .map(|e| self.expr(e, natives).map(untuple))
            .collect()
    }

    fn assign(&mut self, target: &Expr, value: V, natives: &mut dyn Natives) -> Result<(), Flow> {
        match target {
            Expr::Ident(name) => {
                if name != "_" {
                    self.set(name, value);
                }
                Ok(())
            }
            Expr::Unary("*", inner) => self.assign(inner, value, natives),
            Expr::Selector(base, field) => {
                let mut b = self.expr(base, natives)?;
                match &mut b {
                    V::Struct(_, fields) => {
                        fields.insert(field.clone(), value);
                    }
                    V::Nil => {
                        let mut fields = BTreeMap::new();
                        fields.insert(field.clone(), value);
                        b = V::Struct(String::new(), fields);
                    }
                    _ => return Ok(()),
                }
                self.assign(base, b, natives)
            }
            Expr::Index(base, index) => {
                let mut b = self.expr(base, natives)?;
                let k = self.expr(index, natives)?;
                match &mut b {
                    V::Map(pairs) => {
                        if let Some(slot) = pairs.iter_mut().find(|(key, _)| go_eq(key, &k)) {
                            slot.1 = value;
                        } else {
                            pairs.push((k, value));
                        }
                    }
                    V::Nil => b = V::Map(vec![(k, value)]),
                    V::List(items) => {
                        let i = k.int() as usize;
                        if let Some(slot) = items.get_mut(i) {
                            *slot = value;
                        }
                    }
                    _ => return Ok(()),
                }
                self.assign(base, b, natives)
            }
            _ => Ok(()),
        }
    }

    pub fn expr(&mut self, e: &Expr, natives: &mut dyn Natives) -> R {
        match e {
            Expr::Str(s) => Ok(V::Str(s.clone())),
            Expr::Int(i) => Ok(V::Int(*i)),
            Expr::Float(x) => Ok(V::Float(*x)),
            Expr::Ident(name) => self.ident(name, natives),
            Expr::Type(_) => Ok(V::Opaque("type".into())),
            Expr::TypeAssert(inner) => self.expr(inner, natives),
            Expr::Func { params, body } => Ok(V::Func(Rc::new(Closure {
                params: params.clone(),
                results: Vec::new(),
                body: body.clone(),
                env: self.scopes.clone(),
                file: Rc::clone(&self.file),
            }))),
            Expr::Unary(op, inner) => {
                let v = self.expr(inner, natives)?;
                match *op {
                    "!" => Ok(V::Bool(!v.truthy())),
                    "-" => Ok(match v {
                        V::Float(x) => V::Float(-x),
                        other => V::Int(-other.int()),
                    }),
                    // Pointers are values here.
                    _ => Ok(v),
                }
            }
            Expr::Binary(op, l, r) => {
                let a = self.expr(l, natives)?;
                if *op == "&&" && !a.truthy() {
                    return Ok(V::Bool(false));
                }
                if *op == "||" && a.truthy() {
                    return Ok(V::Bool(true));
                }
                let b = self.expr(r, natives)?;
                binary(op, &a, &b)
            }
            Expr::Index(base, index) => {
                let b = self.expr(base, natives)?;
                let k = self.expr(index, natives)?;
                Ok(match &b {
                    V::List(items) => match items.get(k.int() as usize) {
                        Some(v) => v.clone(),
                        None => {
                            return Err(Flow::Fatal(format!(
                                "index out of range [{}] with length {}",
                                k.int(),
                                items.len()
                            )))
                        }
                    },
                    V::Map(_) => b.get(&k).unwrap_or(V::Nil),
                    V::Str(s) => {
                        V::Int(s.as_bytes().get(k.int() as usize).copied().unwrap_or(0) as i64)
                    }
                    _ => V::Nil,
                })
            }
            Expr::Slice(base, lo, hi) => {
                let b = self.expr(base, natives)?;
                let lo = match lo {
                    Some(l) => self.expr(l, natives)?.int() as usize,
                    None => 0,
                };
                match b {
                    V::List(items) => {
                        let hi = match hi {
                            Some(h) => self.expr(h, natives)?.int() as usize,
                            None => items.len(),
                        };
                        Ok(V::List(items.get(lo..hi).unwrap_or_default().to_vec()))
                    }
                    V::Str(s) => {
                        let hi = match hi {
                            Some(h) => self.expr(h, natives)?.int() as usize,
                            None => s.len(),
                        };
                        Ok(V::Str(s.get(lo..hi).unwrap_or_default().to_owned()))
                    }
                    other => Ok(other),
                }
            }
            Expr::Composite { ty, elems } => self.composite(ty.as_ref(), elems, natives),
            Expr::Selector(base, name) => self.selector(base, name, natives),
            Expr::Call { func, args, spread } => self.call(func, args, *spread, natives),
        }
    }

    fn ident(&mut self, name: &str, natives: &mut dyn Natives) -> R {
        if let Some(v) = self.lookup(name) {
            return Ok(v);
        }
        match name {
            "nil" => return Ok(V::Nil),
            "true" => return Ok(V::Bool(true)),
            "false" => return Ok(V::Bool(false)),
            _ => {}
        }
        if let Some((expr, file)) = self.globals.get(name).cloned() {
            let saved = std::mem::replace(&mut self.file, file);
            let v = self.expr(&expr, natives);
            self.file = saved;
            return v;
        }
        if let Some((decl, file)) = self.funcs.get(name).cloned() {
            return Ok(V::Func(Rc::new(Closure {
                params: decl.params.clone(),
                results: decl.results.clone(),
                body: decl.body.clone(),
                env: vec![HashMap::new()],
                file,
            })));
        }
        // A package used as a value only through a selector; a type name
        // used in a conversion.
        Ok(V::Opaque(name.to_owned()))
    }

    fn selector(&mut self, base: &Expr, name: &str, natives: &mut dyn Natives) -> R {
        if let Expr::Ident(pkg) = base {
            if self.lookup(pkg).is_none() {
                if let Some(canonical) = self.file.package(pkg) {
                    return Ok(natives
                        .constant(&canonical, name)
                        .unwrap_or_else(|| V::Opaque(format!("{canonical}.{name}"))));
                }
            }
        }
        let b = self.expr(base, natives)?;
        Ok(match &b {
            V::Struct(..) | V::Map(_) => b.field(name),
            V::Opaque(what) => natives
                .method(self, &b, &format!("field:{name}"), Vec::new())
                .and_then(Result::ok)
                .unwrap_or_else(|| V::Opaque(format!("{what}.{name}"))),
            _ => V::Nil,
        })
    }

    fn composite(
        &mut self,
        ty: Option<&Type>,
        elems: &[(Option<Expr>, Expr)],
        natives: &mut dyn Natives,
    ) -> R {
        let element_type = |ty: Option<&Type>| -> Option<Type> {
            match ty {
                Some(Type::Slice(t) | Type::Array(t)) => Some((**t).clone()),
                Some(Type::Map(t)) => Some((**t).clone()),
                Some(Type::Pointer(t)) => Some((**t).clone()),
                _ => None,
            }
        };
        let value =
            |interp: &mut Interp, e: &Expr, elem: Option<&Type>, natives: &mut dyn Natives| -> R {
                match e {
                    Expr::Composite { ty: None, elems } => interp.composite(elem, elems, natives),
                    Expr::Unary("&", inner) => match &**inner {
                        Expr::Composite { ty: None, elems } => {
                            interp.composite(elem, elems, natives)
                        }
                        _ => interp.expr(e, natives),
                    },
                    other => interp.expr(other, natives),
                }
            };
        match ty {
            Some(Type::Slice(_) | Type::Array(_)) => {
                let elem = element_type(ty);
                let mut items = Vec::new();
                for (_, e) in elems {
                    items.push(value(self, e, elem.as_ref(), natives)?);
                }
                Ok(V::List(items))
            }
            Some(Type::Map(..)) => {
                let elem = element_type(ty);
                let mut pairs = Vec::new();
                for (k, e) in elems {
                    let k = match k {
                        Some(k) => self.expr(k, natives)?,
                        None => V::Nil,
                    };
                    pairs.push((k, value(self, e, elem.as_ref(), natives)?));
                }
                Ok(V::Map(pairs))
            }
            Some(Type::Pointer(t)) => self.composite(Some(t), elems, natives),
            Some(Type::Struct(fields)) => {
                let mut out = BTreeMap::new();
                for (i, (k, e)) in elems.iter().enumerate() {
                    let name = match k {
                        Some(Expr::Ident(n)) => n.clone(),
                        _ => fields.get(i).cloned().unwrap_or_default(),
                    };
                    out.insert(name, value(self, e, None, natives)?);
                }
                Ok(V::Struct("struct".into(), out))
            }
            other => {
                let name = match other {
                    Some(Type::Named(n)) => n.rsplit('.').next().unwrap_or(n).to_owned(),
                    _ => String::new(),
                };
                // Keyed: a struct. Unkeyed (with no type: the element of
                // an outer literal we do not know): a list.
                if elems.iter().all(|(k, _)| matches!(k, Some(Expr::Ident(_)))) && !elems.is_empty()
                {
                    let mut out = BTreeMap::new();
                    for (k, e) in elems {
                        if let Some(Expr::Ident(n)) = k {
                            out.insert(n.clone(), value(self, e, None, natives)?);
                        }
                    }
                    Ok(V::Struct(name, out))
                } else if elems.iter().any(|(k, _)| k.is_some()) {
                    let mut pairs = Vec::new();
                    for (k, e) in elems {
                        let k = match k {
                            Some(k) => self.expr(k, natives)?,
                            None => V::Nil,
                        };
                        pairs.push((k, value(self, e, None, natives)?));
                    }
                    Ok(V::Map(pairs))
                } else if elems.is_empty() && !name.is_empty() {
                    Ok(V::Struct(name, BTreeMap::new()))
                } else {
                    let mut items = Vec::new();
                    for (_, e) in elems {
                        items.push(value(self, e, None, natives)?);
                    }
                    Ok(V::List(items))
                }
            }
        }
    }

    fn call(&mut self, func: &Expr, args: &[Expr], spread: bool, natives: &mut dyn Natives) -> R {
        // Builtins and conversions by bare name.
        if let Expr::Ident(name) = func {
            if self.lookup(name).is_none() {
                if let Some(r) = self.builtin(name, args, spread, natives) {
                    return r;
                }
            }
        }
        // A conversion to a type: the value itself.
        if matches!(func, Expr::Type(_)) {
            return match args.first() {
                Some(a) => self.expr(a, natives),
                None => Ok(V::Nil),
            };
        }
        let mut values = Vec::new();
        for (i, a) in args.iter().enumerate() {
            let v = self.expr(a, natives)?;
            if spread && i + 1 == args.len() {
                values.extend(v.list());
            } else {
                values.push(untuple(v));
            }
        }
        if let Expr::Selector(base, name) = func {
            if let Expr::Ident(pkg) = &**base {
                if self.lookup(pkg).is_none() {
                    if let Some(canonical) = self.file.package(pkg) {
                        if let Some(r) = std_call(&canonical, name, &values) {
                            return r;
                        }
                        if let Some(r) = natives.call(self, &canonical, name, values.clone()) {
                            return r;
                        }
                        // A conversion to a named type of a package.
                        if name.chars().next().is_some_and(char::is_uppercase)
                            && values.len() == 1
                            && is_type_name(name)
                        {
                            return Ok(values.remove(0));
                        }
                        self.unknown.push(format!("{canonical}.{name}"));
                        return Ok(V::Opaque(format!("{canonical}.{name}()")));
                    }
                }
            }
            let recv = self.expr(base, natives)?;
            // `url.Values` and other maps: methods that change the map
            // write it back (Go maps are references).
            if let V::Map(pairs) = &recv {
                if let Some(changed) = map_method(pairs, name, &values) {
                    return match changed {
                        MapCall::Value(v) => Ok(v),
                        MapCall::Changed(pairs) => {
                            self.assign(base, V::Map(pairs), natives)?;
                            Ok(V::Nil)
                        }
                    };
                }
            }
            if let V::Func(_) = recv.field(name) {
                let f = recv.field(name);
                return self.call_value(&f, values, natives);
            }
            if let Some(r) = natives.method(self, &recv, name, values.clone()) {
                return r;
            }
            if let Some(r) = std_method(&recv, name, &values) {
                return r;
            }
            self.unknown.push(format!("{recv:?}.{name}"));
            return Ok(V::Opaque(format!("{name}()")));
        }
        let f = self.expr(func, natives)?;
        match &f {
            V::Func(_) => self.call_value(&f, values, natives),
            // A conversion (`v1.Kind("x")` through a local alias, `string(x)`).
            _ => Ok(values.into_iter().next().unwrap_or(V::Nil)),
        }
    }

    fn builtin(
        &mut self,
        name: &str,
        args: &[Expr],
        spread: bool,
        natives: &mut dyn Natives,
    ) -> Option<R> {
        let mut eval = |interp: &mut Interp| -> Result<Vec<V>, Flow> {
            args.iter()
                .map(|a| interp.expr(a, natives).map(untuple))
                .collect()
        };
        Some(match name {
            "len" => eval(self).map(|v| {
                V::Int(match v.first() {
                    Some(V::Str(s)) => s.len() as i64,
                    Some(V::List(l)) => l.len() as i64,
                    Some(V::Map(m)) => m.len() as i64,
                    _ => 0,
                })
            }),
            "append" => eval(self).map(|mut v| {
                let mut base = if v.is_empty() {
                    Vec::new()
                } else {
                    v.remove(0).list()
                };
                let last = if spread { v.pop() } else { None };
                base.extend(v);
                if let Some(last) = last {
                    base.extend(last.list());
                }
                V::List(base)
            }),
            "make" => Ok(match args.first() {
                Some(Expr::Type(Type::Map(..))) => V::Map(Vec::new()),
                _ => V::List(Vec::new()),
            }),
            // `new(T)` is a zero value; `new(expr)` (Go 1.26) a pointer to
            // the value, which here is the value.
            "new" => match args.first() {
                Some(Expr::Type(_)) | None => Ok(V::Nil),
                Some(_) => eval(self).map(|v| v.into_iter().next().unwrap_or(V::Nil)),
            },
            "delete" => {
                let v = match eval(self) {
                    Ok(v) => v,
                    Err(f) => return Some(Err(f)),
                };
                if let (Some(target), Some(V::Map(pairs)), Some(k)) =
                    (args.first(), v.first(), v.get(1))
                {
                    let kept = V::Map(
                        pairs
                            .iter()
                            .filter(|(key, _)| !go_eq(key, k))
                            .cloned()
                            .collect(),
                    );
                    if let Err(f) = self.assign(target, kept, natives) {
                        return Some(Err(f));
                    }
                }
                Ok(V::Nil)
            }
            "string" | "int" | "int32" | "int64" | "float64" | "uint32" | "bool" => {
                eval(self).map(|v| {
                    let v = v.into_iter().next().unwrap_or(V::Nil);
                    match name {
                        "string" => V::Str(v.str()),
                        "float64" => V::Float(v.float()),
                        "bool" => v,
                        _ => V::Int(v.int()),
                    }
                })
            }
            "panic" => eval(self).and_then(|v| Err(Flow::Fatal(format!("panic: {v:?}")))),
            _ => return None,
        })
    }
}

fn is_type_name(name: &str) -> bool {
    !name.starts_with("Must")
        && !name.starts_with("Make")
        && !name.starts_with("New")
        && !name.starts_with("Get")
}

pub fn tuple(mut items: Vec<V>) -> V {
    if items.len() == 1 {
        items.remove(0)
    } else {
        V::Tuple(items)
    }
}

fn untuple(v: V) -> V {
    match v {
        V::Tuple(mut items) if !items.is_empty() => items.remove(0),
        other => other,
    }
}

fn binary(op: &str, a: &V, b: &V) -> R {
    Ok(match op {
        "==" => V::Bool(go_eq(a, b)),
        "!=" => V::Bool(!go_eq(a, b)),
        "&&" => V::Bool(a.truthy() && b.truthy()),
        "||" => V::Bool(a.truthy() || b.truthy()),
        "+" => match (a, b) {
            (V::Str(x), y) => V::Str(format!("{x}{}", y.str())),
            (V::Nil, V::Str(y)) => V::Str(y.clone()),
            (V::Float(_), _) | (_, V::Float(_)) => V::Float(a.float() + b.float()),
            _ => V::Int(a.int() + b.int()),
        },
        "-" | "*" | "/" | "%" => {
            if matches!(a, V::Float(_)) || matches!(b, V::Float(_)) {
                let (x, y) = (a.float(), b.float());
                V::Float(match op {
                    "-" => x - y,
                    "*" => x * y,
                    "/" => x / y,
                    _ => x % y,
                })
            } else {
                let (x, y) = (a.int(), b.int());
                V::Int(match op {
                    "-" => x - y,
                    "*" => x * y,
                    "/" if y != 0 => x / y,
                    "%" if y != 0 => x % y,
                    _ => return Err(Flow::Fatal("integer divide by zero".into())),
                })
            }
        }
        "<" | "<=" | ">" | ">=" => {
            let ord = match (a, b) {
                (V::Str(x), V::Str(y)) => x.cmp(y),
                _ => a
                    .float()
                    .partial_cmp(&b.float())
                    .unwrap_or(std::cmp::Ordering::Equal),
            };
            V::Bool(match op {
                "<" => ord.is_lt(),
                "<=" => ord.is_le(),
                ">" => ord.is_gt(),
                _ => ord.is_ge(),
            })
        }
        "|" => V::Int(a.int() | b.int()),
        "&" => V::Int(a.int() & b.int()),
        _ => return Err(Flow::Fatal(format!("operator {op} is not read"))),
    })
}

/// Go's `%v`-ish formatting of `fmt.Sprintf`.
pub fn sprintf(format: &str, args: &[V]) -> String {
    let mut out = String::new();
    let mut args = args.iter();
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        // Flags and width.
        let mut verb = chars.next().unwrap_or('%');
        while verb.is_ascii_digit() || matches!(verb, '+' | '-' | '#' | '.') {
            verb = chars.next().unwrap_or('v');
        }
        if verb == '%' {
            out.push('%');
            continue;
        }
        let arg = args.next().cloned().unwrap_or(V::Nil);
        match verb {
            'q' => out.push_str(&format!("{:?}", arg.str())),
            _ => out.push_str(&arg.str()),
        }
    }
    out
}

/// The Go standard library the bodies call.
fn std_call(pkg: &str, name: &str, args: &[V]) -> Option<R> {
    let s = |i: usize| args.get(i).map(V::str).unwrap_or_default();
    Some(Ok(match (pkg, name) {
        ("fmt", "Sprintf") => V::Str(sprintf(&s(0), args.get(1..).unwrap_or_default())),
        ("fmt", "Sprint") => V::Str(args.iter().map(V::str).collect()),
        ("fmt", "Errorf") => V::Str(sprintf(&s(0), args.get(1..).unwrap_or_default())),
        ("errors", "New") => V::Str(s(0)),
        ("strings", "HasPrefix") => V::Bool(s(0).starts_with(&s(1))),
        ("strings", "HasSuffix") => V::Bool(s(0).ends_with(&s(1))),
        ("strings", "Contains") => V::Bool(s(0).contains(&s(1))),
        ("strings", "ToLower") => V::Str(s(0).to_lowercase()),
        ("strings", "ToUpper") => V::Str(s(0).to_uppercase()),
        ("strings", "TrimSpace") => V::Str(s(0).trim().to_owned()),
        ("strings", "TrimPrefix") => {
            V::Str(s(0).strip_prefix(&s(1)).map(str::to_owned).unwrap_or(s(0)))
        }
        ("strings", "TrimSuffix") => {
            V::Str(s(0).strip_suffix(&s(1)).map(str::to_owned).unwrap_or(s(0)))
        }
        ("strings", "Repeat") => {
            V::Str(s(0).repeat(args.get(1).map(V::int).unwrap_or(0).max(0) as usize))
        }
        ("strings", "Split") => V::List(s(0).split(&s(1)).map(|p| V::Str(p.to_owned())).collect()),
        ("strings", "Join") => V::Str(
            args.first()
                .map(V::list)
                .unwrap_or_default()
                .iter()
                .map(V::str)
                .collect::<Vec<_>>()
                .join(&s(1)),
        ),
        ("strings", "ReplaceAll") => V::Str(s(0).replace(&s(1), &s(2))),
        ("strings", "EqualFold") => V::Bool(s(0).eq_ignore_ascii_case(&s(1))),
        ("strings", "Cut") => match s(0).split_once(&s(1)) {
            Some((a, b)) => V::Tuple(vec![V::Str(a.into()), V::Str(b.into()), V::Bool(true)]),
            None => V::Tuple(vec![V::Str(s(0)), V::Str(String::new()), V::Bool(false)]),
        },
        ("strconv", "Itoa") => V::Str(args.first().map(V::int).unwrap_or(0).to_string()),
        ("strconv", "Atoi") => V::Tuple(vec![V::Int(s(0).parse().unwrap_or(0)), V::Nil]),
        ("net", "JoinHostPort") => {
            let host = s(0);
            V::Str(if host.contains(':') {
                format!("[{host}]:{}", s(1))
            } else {
                format!("{host}:{}", s(1))
            })
        }
        ("net", "SplitHostPort") => match s(0).rsplit_once(':') {
            Some((h, p)) => V::Tuple(vec![
                V::Str(h.trim_start_matches('[').trim_end_matches(']').to_owned()),
                V::Str(p.to_owned()),
                V::Nil,
            ]),
            None => V::Tuple(vec![
                V::Str(String::new()),
                V::Str(String::new()),
                V::Str("missing port in address".into()),
            ]),
        },
        ("ptr", "To") | ("ptr", "Deref") => args.first().cloned().unwrap_or(V::Nil),
        // Times are milliseconds since the epoch; durations milliseconds.
        ("time", "Now") => V::Int(now_ms()),
        ("time", "Since") => V::Int(now_ms() - args.first().map(V::int).unwrap_or(0)),
        // Sleeps are waits for a cluster to settle: a short one is enough.
        ("time", "Sleep") => {
            let ms = args.first().map(V::int).unwrap_or(0).clamp(0, 100) as u64;
            std::thread::sleep(std::time::Duration::from_millis(ms));
            V::Nil
        }
        ("time", "Duration") => args.first().cloned().unwrap_or(V::Int(0)),
        ("slices", "Contains") => V::Bool(
            args.first()
                .map(V::list)
                .unwrap_or_default()
                .iter()
                .any(|v| go_eq(v, args.get(1).unwrap_or(&V::Nil))),
        ),
        ("types", "NamespacedName") => args.first().cloned().unwrap_or(V::Nil),
        ("uuid", "NewString") | ("uuid", "New") => V::Str(format!(
            "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
            fastrand::u32(..),
            fastrand::u16(..),
            fastrand::u16(..0x1000),
            fastrand::u16(..0x1000),
            fastrand::u64(..1 << 48)
        )),
        ("context", "Background") | ("context", "TODO") => V::Opaque("ctx".into()),
        ("context", "WithTimeout") | ("context", "WithCancel") => {
            V::Tuple(vec![V::Opaque("ctx".into()), V::Opaque("noop".into())])
        }
        ("url", "QueryEscape") | ("url", "PathEscape") => V::Str(query_escape(&s(0))),
        _ => return None,
    }))
}

fn std_method(recv: &V, name: &str, _args: &[V]) -> Option<R> {
    Some(Ok(match (recv, name) {
        (V::Struct(ty, _), "String") if ty == "NamespacedName" || recv.field("Name") != V::Nil => {
            let ns = recv.field("Namespace").str();
            let n = recv.field("Name").str();
            V::Str(if ns.is_empty() {
                n
            } else {
                format!("{ns}/{n}")
            })
        }
        (V::Str(s), "Error") | (V::Str(s), "String") => V::Str(s.clone()),
        // Goroutines run to their end as they start: nothing to wait for.
        (_, "Add" | "Done" | "Wait" | "Lock" | "Unlock" | "RLock" | "RUnlock")
            if !matches!(recv, V::Map(_)) =>
        {
            V::Nil
        }
        // The request id only makes a request findable in logs: leaving
        // it out changes nothing compared.
        (V::Struct(..), "AddRequestIDQueryParam") => V::Nil,
        (_, "Error") => V::Str(format!("{recv:?}")),
        _ => return None,
    }))
}

impl PartialEq for V {
    fn eq(&self, other: &V) -> bool {
        go_eq(self, other)
    }
}

pub enum MapCall {
    Value(V),
    Changed(Vec<(V, V)>),
}

/// `url.Values`/`http.Header` methods, and `Get` on any map.
fn map_method(pairs: &[(V, V)], name: &str, args: &[V]) -> Option<MapCall> {
    let key = args.first().cloned().unwrap_or(V::Nil);
    let value = args.get(1).cloned().unwrap_or(V::Nil);
    let mut out = pairs.to_vec();
    Some(match name {
        "Set" => {
            out.retain(|(k, _)| !go_eq(k, &key));
            out.push((key, V::List(vec![value])));
            MapCall::Changed(out)
        }
        "Add" => {
            match out.iter_mut().find(|(k, _)| go_eq(k, &key)) {
                Some((_, V::List(values))) => values.push(value),
                _ => out.push((key, V::List(vec![value]))),
            }
            MapCall::Changed(out)
        }
        "Del" => {
            out.retain(|(k, _)| !go_eq(k, &key));
            MapCall::Changed(out)
        }
        "Get" => MapCall::Value(
            pairs
                .iter()
                .find(|(k, _)| go_eq(k, &key))
                .map(|(_, v)| v.list().first().cloned().unwrap_or(V::Nil))
                .unwrap_or(V::Str(String::new())),
        ),
        "Encode" => {
            let mut sorted = pairs.to_vec();
            sorted.sort_by_key(|(k, _)| k.str());
            let mut parts = Vec::new();
            for (k, values) in sorted {
                for v in values.list() {
                    parts.push(format!(
                        "{}={}",
                        query_escape(&k.str()),
                        query_escape(&v.str())
                    ));
                }
            }
            MapCall::Value(V::Str(parts.join("&")))
        }
        _ => return None,
    })
}

/// Go's `url.QueryEscape`.
fn query_escape(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
