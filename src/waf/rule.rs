//! What a SecLang rule says, read from its directive's arguments: the
//! targets (`ARGS|!ARGS:foo|&TX:x|REQUEST_HEADERS:/^x-/`), the operator
//! (`!@rx …`, an `@rx` when none is named) and the actions
//! (`id:1,phase:2,t:lowercase,msg:'…',setvar:'tx.a=+%{tx.b}'`).
//!
//! Only the names the engine evaluates are accepted: the variables,
//! operators, transformations, actions and `ctl` options the OWASP Core
//! Rule Set v4 uses, and a few of their obvious companions. Any other is
//! refused by name rather than read and ignored.

use super::lex::clip;

/// Declares an enum of SecLang names and its look-up by name (variables
/// and `ctl` options in capitals or as written; operators and
/// transformations as written, matched without regard to case as
/// ModSecurity does).
macro_rules! names {
    ($(#[$meta:meta])* $name:ident { $($variant:ident = $text:literal,)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name { $($variant,)* }

        impl $name {
            pub fn named(text: &str) -> Option<Self> {
                $(if text.eq_ignore_ascii_case($text) { return Some(Self::$variant); })*
                None
            }

            pub fn name(self) -> &'static str {
                match self { $(Self::$variant => $text,)* }
            }
        }
    };
}

names! {
    /// A variable (collection) a rule reads.
    Variable {
        Args = "ARGS",
        ArgsCombinedSize = "ARGS_COMBINED_SIZE",
        ArgsGet = "ARGS_GET",
        ArgsGetNames = "ARGS_GET_NAMES",
        ArgsNames = "ARGS_NAMES",
        ArgsPost = "ARGS_POST",
        ArgsPostNames = "ARGS_POST_NAMES",
        Files = "FILES",
        FilesCombinedSize = "FILES_COMBINED_SIZE",
        FilesNames = "FILES_NAMES",
        MatchedVar = "MATCHED_VAR",
        MatchedVarName = "MATCHED_VAR_NAME",
        MatchedVars = "MATCHED_VARS",
        MatchedVarsNames = "MATCHED_VARS_NAMES",
        MultipartPartHeaders = "MULTIPART_PART_HEADERS",
        QueryString = "QUERY_STRING",
        RemoteAddr = "REMOTE_ADDR",
        ReqbodyError = "REQBODY_ERROR",
        ReqbodyProcessor = "REQBODY_PROCESSOR",
        RequestBasename = "REQUEST_BASENAME",
        RequestBody = "REQUEST_BODY",
        RequestBodyLength = "REQUEST_BODY_LENGTH",
        RequestCookies = "REQUEST_COOKIES",
        RequestCookiesNames = "REQUEST_COOKIES_NAMES",
        RequestFilename = "REQUEST_FILENAME",
        RequestHeaders = "REQUEST_HEADERS",
        RequestHeadersNames = "REQUEST_HEADERS_NAMES",
        RequestLine = "REQUEST_LINE",
        RequestMethod = "REQUEST_METHOD",
        RequestProtocol = "REQUEST_PROTOCOL",
        RequestUri = "REQUEST_URI",
        RequestUriRaw = "REQUEST_URI_RAW",
        ResponseBody = "RESPONSE_BODY",
        ResponseHeaders = "RESPONSE_HEADERS",
        ResponseHeadersNames = "RESPONSE_HEADERS_NAMES",
        ResponseStatus = "RESPONSE_STATUS",
        Tx = "TX",
        UniqueId = "UNIQUE_ID",
        Xml = "XML",
    }
}

names! {
    /// What a rule tests its values with.
    OperatorKind {
        BeginsWith = "beginsWith",
        Contains = "contains",
        ContainsWord = "containsWord",
        DetectSqli = "detectSQLi",
        DetectXss = "detectXSS",
        EndsWith = "endsWith",
        Eq = "eq",
        Ge = "ge",
        Gt = "gt",
        IpMatch = "ipMatch",
        Le = "le",
        Lt = "lt",
        Pm = "pm",
        PmFromFile = "pmFromFile",
        Rx = "rx",
        Streq = "streq",
        UnconditionalMatch = "unconditionalMatch",
        ValidateByteRange = "validateByteRange",
        ValidateUrlEncoding = "validateUrlEncoding",
        ValidateUtf8Encoding = "validateUtf8Encoding",
        Within = "within",
    }
}

names! {
    /// A transformation applied to each value before the operator.
    Transform {
        Base64Decode = "base64Decode",
        CmdLine = "cmdLine",
        CompressWhitespace = "compressWhitespace",
        CssDecode = "cssDecode",
        EscapeSeqDecode = "escapeSeqDecode",
        HexEncode = "hexEncode",
        HtmlEntityDecode = "htmlEntityDecode",
        JsDecode = "jsDecode",
        Length = "length",
        Lowercase = "lowercase",
        NormalizePath = "normalizePath",
        NormalizePathWin = "normalizePathWin",
        RemoveCommentsChar = "removeCommentsChar",
        RemoveNulls = "removeNulls",
        RemoveWhitespace = "removeWhitespace",
        ReplaceComments = "replaceComments",
        Sha1 = "sha1",
        Trim = "trim",
        UrlDecode = "urlDecode",
        UrlDecodeUni = "urlDecodeUni",
        Utf8ToUnicode = "utf8toUnicode",
    }
}

names! {
    /// What a `ctl` action changes for the rest of the transaction.
    CtlOption {
        AuditEngine = "auditEngine",
        ForceRequestBodyVariable = "forceRequestBodyVariable",
        RequestBodyProcessor = "requestBodyProcessor",
        RuleEngine = "ruleEngine",
        RuleRemoveById = "ruleRemoveById",
        RuleRemoveByTag = "ruleRemoveByTag",
        RuleRemoveTargetById = "ruleRemoveTargetById",
        RuleRemoveTargetByTag = "ruleRemoveTargetByTag",
    }
}

/// Which part of a collection a target names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    /// `ARGS:name` (matched without regard to case).
    Name(String),
    /// `ARGS:/regex/`.
    Pattern(String),
}

/// One target of a rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub variable: Variable,
    pub selector: Option<Selector>,
    /// `&VAR`: the number of values, not the values.
    pub count: bool,
    /// `!VAR:x`: taken out of the values of the same variable.
    pub exclude: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operator {
    pub kind: OperatorKind,
    pub negated: bool,
    pub param: String,
}

/// A rule's disruptive action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disruptive {
    Pass,
    Block,
    Deny,
    Drop,
    Allow,
}

/// How `setvar` changes a transaction variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetOp {
    Set(String),
    Add(String),
    Sub(String),
    Delete,
}

/// `setvar:'tx.name=value'` (the name and the value may hold `%{…}`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetVar {
    pub collection: String,
    pub name: String,
    pub op: SetOp,
}

/// `ctl:option=value`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ctl {
    pub option: CtlOption,
    pub value: String,
}

/// Everything a rule's actions say.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Actions {
    pub id: Option<u32>,
    pub phase: Option<u8>,
    pub disruptive: Option<Disruptive>,
    /// The transformations in order; `t:none` clears those before it
    /// (and the default action's).
    pub transforms: Vec<Transform>,
    pub transforms_reset: bool,
    pub msg: Option<String>,
    pub logdata: Option<String>,
    pub tags: Vec<String>,
    pub severity: Option<u8>,
    pub capture: bool,
    pub multi_match: bool,
    pub chain: bool,
    pub setvars: Vec<SetVar>,
    pub skip_after: Option<String>,
    pub ctls: Vec<Ctl>,
    /// `log`/`nolog`; `auditlog`/`noauditlog`.
    pub log: Option<bool>,
    pub auditlog: Option<bool>,
    pub status: Option<u16>,
    pub ver: Option<String>,
    /// `initcol:global=global`: persistent collections are not kept
    /// between requests; the collections named are empty each time (as
    /// in Coraza). The Core Rule Set opens them only with
    /// `tx.enable_default_collections=1`.
    pub initcol: Vec<String>,
}

/// `ARGS|!ARGS:foo|&TX:x`: the targets, or why not.
pub fn targets(text: &str) -> Result<Vec<Target>, String> {
    let mut found = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let (exclude, count) = match rest.as_bytes()[0] {
            b'!' => (true, false),
            b'&' => (false, true),
            _ => (false, false),
        };
        if exclude || count {
            rest = &rest[1..];
        }
        let name_end = rest.find([':', '|']).unwrap_or(rest.len());
        let name = &rest[..name_end];
        let variable = Variable::named(name).ok_or_else(|| format!("unknown variable '{name}'"))?;
        rest = &rest[name_end..];
        let mut selector = None;
        if let Some(after) = rest.strip_prefix(':') {
            // XML's selector is an XPath expression, never a pattern.
            let (chosen, left) = if variable == Variable::Xml {
                let end = after.find('|').unwrap_or(after.len());
                (Selector::Name(after[..end].to_owned()), &after[end..])
            } else {
                take_selector(after)?
            };
            selector = Some(chosen);
            rest = left;
        }
        if exclude && selector.is_none() {
            return Err(format!(
                "'!{name}' takes out nothing: name a part (!{name}:x)"
            ));
        }
        found.push(Target {
            variable,
            selector,
            count,
            exclude,
        });
        match rest.strip_prefix('|') {
            Some(left) if !left.is_empty() => rest = left,
            Some(_) => return Err("the targets end with '|'".into()),
            None => {}
        }
    }
    if found.is_empty() {
        return Err("no target".into());
    }
    Ok(found)
}

/// A selector and what follows it: `/regex/` up to its unescaped closing
/// slash, a quoted `'name'`, or a name up to the next `|`.
fn take_selector(text: &str) -> Result<(Selector, &str), String> {
    if let Some(body) = text.strip_prefix('/') {
        let mut escaped = false;
        for (i, c) in body.char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '/' if body[i + 1..].is_empty() || body[i + 1..].starts_with('|') => {
                    return Ok((Selector::Pattern(body[..i].to_owned()), &body[i + 1..]));
                }
                _ => {}
            }
        }
        return Err(format!(
            "a selector opens '/' it does not close: /{}",
            clip(body)
        ));
    }
    if let Some(body) = text.strip_prefix('\'') {
        let end = body.find('\'').ok_or_else(|| {
            format!(
                "a selector opens a quote it does not close: '{}",
                clip(body)
            )
        })?;
        return Ok((Selector::Name(body[..end].to_owned()), &body[end + 1..]));
    }
    let end = text.find('|').unwrap_or(text.len());
    if end == 0 {
        return Err("an empty selector after ':'".into());
    }
    Ok((Selector::Name(text[..end].to_owned()), &text[end..]))
}

/// `@rx …`, `!@pm a b`, or a bare pattern (an `@rx`).
pub fn operator(text: &str) -> Result<Operator, String> {
    let (negated, text) = match text.strip_prefix('!') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let Some(named) = text.strip_prefix('@') else {
        return Ok(Operator {
            kind: OperatorKind::Rx,
            negated,
            param: text.to_owned(),
        });
    };
    let (name, param) = named.split_once(' ').unwrap_or((named, ""));
    let kind = OperatorKind::named(name).ok_or_else(|| format!("unknown operator '@{name}'"))?;
    Ok(Operator {
        kind,
        negated,
        param: param.to_owned(),
    })
}

/// The actions of `text` (`a,b:c,d:'e,f'`), or every one that cannot be read.
pub fn actions(text: &str) -> Result<Actions, Vec<String>> {
    let mut actions = Actions::default();
    let mut errors = Vec::new();
    for item in split_actions(text) {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        let (name, value) = match item.split_once(':') {
            Some((name, value)) => (name.trim(), Some(unquote(value.trim()))),
            None => (item, None),
        };
        if let Err(error) = apply(&mut actions, name, value) {
            errors.push(error);
        }
    }
    if errors.is_empty() {
        Ok(actions)
    } else {
        Err(errors)
    }
}

/// Whether an actions text holds `chain` (read even when the rest of it
/// cannot be, to keep a broken chain's links together).
pub(super) fn chains(text: &str) -> bool {
    split_actions(text).iter().any(|a| a.trim() == "chain")
}

/// Splits at commas outside single quotes.
fn split_actions(text: &str) -> Vec<&str> {
    let mut items = Vec::new();
    let mut quoted = false;
    let mut start = 0;
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '\'' => quoted = !quoted,
            ',' if !quoted => {
                items.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&text[start..]);
    items
}

/// `'text'` without its quotes (`\'` inside is a quote).
fn unquote(value: &str) -> String {
    match value.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')) {
        Some(inner) => inner.replace("\\'", "'"),
        None => value.to_owned(),
    }
}

fn apply(actions: &mut Actions, name: &str, value: Option<String>) -> Result<(), String> {
    let needs =
        |value: Option<String>| value.ok_or_else(|| format!("'{name}' needs a value ({name}:…)"));
    match name {
        "id" => {
            let text = needs(value)?;
            let id = text
                .parse::<u32>()
                .ok()
                .filter(|id| *id > 0)
                .ok_or_else(|| format!("id '{text}' is not a number from 1"))?;
            actions.id = Some(id);
        }
        "phase" => {
            let text = needs(value)?;
            let phase = match text.as_str() {
                "request" => 2,
                "response" => 4,
                "logging" => 5,
                other => other
                    .parse::<u8>()
                    .ok()
                    .filter(|p| (1..=5).contains(p))
                    .ok_or_else(|| format!("phase '{other}' is not 1 to 5"))?,
            };
            actions.phase = Some(phase);
        }
        "pass" | "block" | "deny" | "drop" | "allow" => {
            if let Some(value) = value {
                return Err(format!("'{name}' takes no value (got '{value}')"));
            }
            actions.disruptive = Some(match name {
                "pass" => Disruptive::Pass,
                "block" => Disruptive::Block,
                "deny" => Disruptive::Deny,
                "drop" => Disruptive::Drop,
                _ => Disruptive::Allow,
            });
        }
        "t" => {
            let text = needs(value)?;
            if text.eq_ignore_ascii_case("none") {
                actions.transforms.clear();
                actions.transforms_reset = true;
            } else {
                let t = Transform::named(&text)
                    .ok_or_else(|| format!("unknown transformation 't:{text}'"))?;
                actions.transforms.push(t);
            }
        }
        "msg" => actions.msg = Some(needs(value)?),
        "logdata" => actions.logdata = Some(needs(value)?),
        "tag" => actions.tags.push(needs(value)?),
        "ver" => actions.ver = Some(needs(value)?),
        "rev" | "maturity" | "accuracy" => {
            needs(value)?;
        }
        "severity" => {
            let text = needs(value)?;
            actions.severity =
                Some(severity(&text).ok_or_else(|| format!("unknown severity '{text}'"))?);
        }
        "capture" | "multiMatch" | "chain" | "log" | "nolog" | "auditlog" | "noauditlog" => {
            if let Some(value) = value {
                return Err(format!("'{name}' takes no value (got '{value}')"));
            }
            match name {
                "capture" => actions.capture = true,
                "multiMatch" => actions.multi_match = true,
                "chain" => actions.chain = true,
                "log" => actions.log = Some(true),
                "nolog" => actions.log = Some(false),
                "auditlog" => actions.auditlog = Some(true),
                _ => actions.auditlog = Some(false),
            }
        }
        "setvar" => actions.setvars.push(setvar(&needs(value)?)?),
        "initcol" => actions.initcol.push(needs(value)?),
        "skipAfter" => actions.skip_after = Some(needs(value)?),
        "ctl" => actions.ctls.push(ctl(&needs(value)?)?),
        "status" => {
            let text = needs(value)?;
            actions.status = Some(
                text.parse::<u16>()
                    .ok()
                    .filter(|s| (100..=599).contains(s))
                    .ok_or_else(|| format!("status '{text}' is not an HTTP status"))?,
            );
        }
        other => return Err(format!("unknown or unsupported action '{other}'")),
    }
    Ok(())
}

/// A severity by name or number (0 emergency … 7 debug).
fn severity(text: &str) -> Option<u8> {
    const NAMES: [&str; 8] = [
        "EMERGENCY",
        "ALERT",
        "CRITICAL",
        "ERROR",
        "WARNING",
        "NOTICE",
        "INFO",
        "DEBUG",
    ];
    NAMES
        .iter()
        .position(|n| n.eq_ignore_ascii_case(text))
        .and_then(|p| u8::try_from(p).ok())
        .or_else(|| text.parse::<u8>().ok().filter(|n| *n < 8))
}

/// `tx.name=value`, `tx.name=+n`, `tx.name=-n`, `!tx.name`.
fn setvar(text: &str) -> Result<SetVar, String> {
    let (delete, text) = match text.strip_prefix('!') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (target, value) = match text.split_once('=') {
        Some((target, value)) => (target, Some(value)),
        None => (text, None),
    };
    let (collection, name) = target
        .split_once('.')
        .filter(|(c, n)| !c.is_empty() && !n.is_empty())
        .ok_or_else(|| format!("setvar '{text}' names no collection.variable"))?;
    if !collection.eq_ignore_ascii_case("tx") {
        return Err(format!("setvar on '{collection}': only tx is kept"));
    }
    let op = match (delete, value) {
        (true, None) => SetOp::Delete,
        (true, Some(_)) => return Err(format!("setvar '!{text}' deletes and sets at once")),
        (false, None) => SetOp::Set("1".into()),
        (false, Some(value)) => match (value.strip_prefix('+'), value.strip_prefix('-')) {
            (Some(n), _) => SetOp::Add(n.to_owned()),
            (_, Some(n)) => SetOp::Sub(n.to_owned()),
            _ => SetOp::Set(value.to_owned()),
        },
    };
    Ok(SetVar {
        collection: collection.to_ascii_lowercase(),
        name: name.to_ascii_lowercase(),
        op,
    })
}

/// `option=value`.
fn ctl(text: &str) -> Result<Ctl, String> {
    let (name, value) = text
        .split_once('=')
        .ok_or_else(|| format!("ctl '{text}' has no '='"))?;
    let option =
        CtlOption::named(name).ok_or_else(|| format!("unknown or unsupported ctl '{name}'"))?;
    Ok(Ctl {
        option,
        value: value.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_read_counts_exclusions_names_and_patterns_with_bars() {
        let found = targets("ARGS|!ARGS:foo|&TX:x|REQUEST_HEADERS:/^(a|b)\\/c$/|XML:/*").unwrap();
        assert_eq!(found.len(), 5);
        assert!(found[1].exclude);
        assert_eq!(found[1].selector, Some(Selector::Name("foo".into())));
        assert!(found[2].count);
        assert_eq!(found[3].variable, Variable::RequestHeaders);
        assert_eq!(
            found[3].selector,
            Some(Selector::Pattern("^(a|b)\\/c$".into()))
        );
        assert_eq!(found[4].selector, Some(Selector::Name("/*".into())));
        assert!(targets("NOPE").unwrap_err().contains("NOPE"));
        assert!(targets("!ARGS").is_err());
        assert!(targets("ARGS|").is_err());
        assert!(targets("ARGS:/x").is_err());
    }

    #[test]
    fn operators_default_to_rx_and_refuse_unknown_names() {
        assert_eq!(
            operator("!@pm a b").unwrap(),
            Operator {
                kind: OperatorKind::Pm,
                negated: true,
                param: "a b".into()
            }
        );
        assert_eq!(operator("^x$").unwrap().kind, OperatorKind::Rx);
        assert_eq!(operator("@detectSQLi").unwrap().param, "");
        assert!(operator("@inspectFile x")
            .unwrap_err()
            .contains("inspectFile"));
    }

    #[test]
    fn actions_keep_quoted_commas_and_refuse_what_the_engine_would_ignore() {
        let a = actions(
            "id:942100,phase:2,block,capture,t:none,t:utf8toUnicode,t:urlDecodeUni,msg:'a, b',\
             severity:'CRITICAL',setvar:'tx.score=+%{tx.critical}',setvar:!tx.x,\
             ctl:ruleRemoveTargetById=920450;REQUEST_HEADERS:x,tag:'a',tag:'b',chain",
        )
        .unwrap();
        assert_eq!(a.id, Some(942100));
        assert_eq!(a.phase, Some(2));
        assert_eq!(a.disruptive, Some(Disruptive::Block));
        assert!(a.transforms_reset && a.capture && a.chain);
        assert_eq!(
            a.transforms,
            [Transform::Utf8ToUnicode, Transform::UrlDecodeUni]
        );
        assert_eq!(a.msg.as_deref(), Some("a, b"));
        assert_eq!(a.severity, Some(2));
        assert_eq!(a.setvars[0].op, SetOp::Add("%{tx.critical}".into()));
        assert_eq!(a.setvars[1].op, SetOp::Delete);
        assert_eq!(a.ctls[0].option, CtlOption::RuleRemoveTargetById);
        assert_eq!(a.tags, ["a", "b"]);
        let errors =
            actions("id:x,phase:9,exec:/bin/sh,t:nope,setvar:ip.x=1,status:42").unwrap_err();
        assert_eq!(errors.len(), 6, "{errors:?}");
    }
}
