//! SecLang text to directives: a directive is a name and its arguments,
//! on one logical line (a backslash before the end of a line joins the
//! next one), arguments split at blanks outside double quotes. Inside
//! double quotes `\"` is a quote and every other backslash is kept as it
//! is (rules hold regular expressions), as ModSecurity reads them.

/// One directive, with the line it starts on (1-based).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Directive {
    pub line: usize,
    pub name: String,
    pub args: Vec<String>,
}

/// A directive that cannot be read: its line and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LexError {
    pub line: usize,
    pub message: String,
}

/// Every directive of `text`, or every line that cannot be read.
pub fn directives(text: &str) -> Result<Vec<Directive>, Vec<LexError>> {
    let mut found = Vec::new();
    let mut errors = Vec::new();
    let mut logical = String::new();
    let mut start = 0;
    for (index, raw) in text.lines().enumerate() {
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        if logical.is_empty() {
            start = index + 1;
            let trimmed = line.trim_start();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
        }
        match line.strip_suffix('\\') {
            Some(head) => logical.push_str(head),
            None => {
                logical.push_str(line);
                match split(&logical) {
                    Ok(mut words) if !words.is_empty() => {
                        let name = words.remove(0);
                        found.push(Directive {
                            line: start,
                            name,
                            args: words,
                        });
                    }
                    Ok(_) => {}
                    Err(message) => errors.push(LexError {
                        line: start,
                        message,
                    }),
                }
                logical.clear();
            }
        }
    }
    if !logical.trim().is_empty() {
        errors.push(LexError {
            line: start,
            message: "the file ends inside a continued line".into(),
        });
    }
    if errors.is_empty() {
        Ok(found)
    } else {
        Err(errors)
    }
}

/// The words of one logical line.
fn split(line: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut chars = line.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let Some(&first) = chars.peek() else {
            return Ok(words);
        };
        let mut word = String::new();
        if first == '"' {
            chars.next();
            let mut closed = false;
            while let Some(c) = chars.next() {
                match c {
                    '\\' if chars.peek() == Some(&'"') => {
                        chars.next();
                        word.push('"');
                    }
                    '"' => {
                        closed = true;
                        break;
                    }
                    c => word.push(c),
                }
            }
            if !closed {
                return Err(format!(
                    "an argument opens a quote it does not close: \"{}",
                    clip(&word)
                ));
            }
            if chars.peek().is_some_and(|c| !c.is_whitespace()) {
                return Err(format!(
                    "a quoted argument is followed by '{}' without a blank",
                    chars.peek().copied().unwrap_or_default()
                ));
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                word.push(c);
            }
        }
        words.push(word);
    }
}

/// The first 40 characters of `text`, for a message.
pub(super) fn clip(text: &str) -> String {
    let mut clipped: String = text.chars().take(40).collect();
    if clipped.len() < text.len() {
        clipped.push('…');
    }
    clipped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continued_lines_join_and_keep_their_first_line_number() {
        let text = "# comment\n\nSecRule ARGS \"@rx a\\\"b\\d\" \\\n    \"id:1,\\\n    phase:2\"\nSecMarker END\n";
        let found = directives(text).unwrap();
        assert_eq!(found.len(), 2);
        assert_eq!(found[0].line, 3);
        assert_eq!(found[0].name, "SecRule");
        assert_eq!(found[0].args, ["ARGS", "@rx a\"b\\d", "id:1,    phase:2"]);
        assert_eq!(found[1].line, 6);
        assert_eq!(found[1].args, ["END"]);
    }

    #[test]
    fn an_open_quote_and_a_dangling_continuation_are_refused_with_their_lines() {
        let errors = directives("SecRule ARGS \"@rx a\nSecMarker X \\").unwrap_err();
        assert_eq!(errors.len(), 2);
        assert_eq!(errors[0].line, 1);
        assert!(errors[0].message.contains("quote"), "{}", errors[0].message);
        assert_eq!(errors[1].line, 2);
    }
}
