//! Configurations for the crate's unit tests, written from their parts:
//! the preamble every test would otherwise repeat (the admin API and a
//! listener `web`, each on port 0) once, then what the test adds, in
//! order. `tests/it/harness.rs` has the same for the integration tests.

/// A configuration text under construction.
#[derive(Default)]
pub(crate) struct TestConfig {
    sections: Vec<String>,
}

impl TestConfig {
    /// Nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The usual start: `[admin]` and an `http` listener `web`, both on
    /// port 0.
    pub fn web() -> Self {
        Self::new().admin("").listener("web", "")
    }

    /// `[admin]` on port 0, with `lines`.
    pub fn admin(self, lines: &str) -> Self {
        self.text(&format!("[admin]\nbind = \"127.0.0.1:0\"\n{lines}"))
    }

    /// A listener on port 0, with `lines`.
    pub fn listener(self, name: &str, lines: &str) -> Self {
        self.text(&format!(
            "[[listeners]]\nname = \"{name}\"\nbind = \"127.0.0.1:0\"\n{lines}"
        ))
    }

    /// A route with `lines` (its `listeners` among them).
    pub fn route(self, name: &str, lines: &str) -> Self {
        self.text(&format!("[[routes]]\nname = \"{name}\"\n{lines}"))
    }

    /// A route on `web` that answers `body` itself.
    pub fn respond(self, name: &str, body: &str) -> Self {
        self.route(
            name,
            &format!("listeners = [\"web\"]\nrespond = {{ body = \"{body}\" }}"),
        )
    }

    /// An upstream of `backends` (addresses as written), with `lines`.
    pub fn upstream(self, name: &str, backends: &[&str], lines: &str) -> Self {
        let list: Vec<String> = backends
            .iter()
            .map(|b| format!("{{ addr = \"{b}\" }}"))
            .collect();
        self.text(&format!(
            "[upstreams.{name}]\nbackends = [{}]\n{lines}",
            list.join(", ")
        ))
    }

    /// Anything else, as given.
    pub fn text(mut self, text: &str) -> Self {
        self.sections.push(text.trim().to_owned());
        self
    }

    pub fn build(self) -> String {
        let mut out = String::new();
        for section in &self.sections {
            out.push_str(section);
            out.push_str("\n\n");
        }
        out
    }

    /// The text as a configuration read from the current folder.
    pub fn source(self) -> crate::config::ConfigText {
        crate::config::ConfigText::inline(self.build(), ".".into(), "<test>")
    }
}

#[test]
fn the_parts_make_a_configuration_that_validates() {
    let config = TestConfig::web()
        .respond("hello", "hi")
        .route(
            "api",
            "listeners = [\"web\"]\npath_prefix = \"/api\"\nupstream = \"app\"",
        )
        .upstream("app", &["127.0.0.1:9", "127.0.0.1:10"], "")
        .source();
    let spec = crate::plan::validate(&config).unwrap_or_else(|e| panic!("{e:?}\n{}", config.text));
    assert_eq!(spec.routes.len(), 2);
    assert_eq!(spec.upstreams[0].name, "app");
}
