//! Ownership classes: which setting may change in which way (DESIGN §1).
//!
//! This is the one table that decides whether a change is applied live by
//! activation or needs a drain-aware restart. Keep it in sync with the
//! ownership table in `docs/architecture.md`.

use serde_json::Value;

/// Who owns a setting, and so what may change it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ownership {
    /// Fixed for the life of the process: changed by a drain-aware restart only.
    StartupOwned,
    /// Lives in one generation: changed by activate, rollback, reload.
    GenerationOwned,
    /// Certificate material: changed by reload-certs and by activation.
    CertificateMaterial,
}

/// Field paths and their owners; `*` stands for one name. The first match
/// wins; a path no pattern names is generation-owned.
const OWNERSHIP: &[(&str, Ownership)] = &[
    // Freeze windows change with the calendar, not with the process.
    ("admin.freeze", Ownership::GenerationOwned),
    ("admin", Ownership::StartupOwned),
    ("admin.*", Ownership::StartupOwned),
    ("discovery", Ownership::StartupOwned),
    ("discovery.*", Ownership::StartupOwned),
    ("fleet", Ownership::StartupOwned),
    ("fleet.*", Ownership::StartupOwned),
    ("metrics", Ownership::StartupOwned),
    ("metrics.bind", Ownership::StartupOwned),
    ("metrics.max_series", Ownership::StartupOwned),
    ("log.format", Ownership::StartupOwned),
    ("log.file", Ownership::StartupOwned),
    ("log.access_file", Ownership::StartupOwned),
    ("tracing.otlp_endpoint", Ownership::StartupOwned),
    ("tracing.service_name", Ownership::StartupOwned),
    ("tracing.sample_ratio", Ownership::GenerationOwned),
    ("log.level", Ownership::GenerationOwned),
    ("log.access", Ownership::GenerationOwned),
    ("runtime.worker_threads", Ownership::StartupOwned),
    ("runtime.state_dir", Ownership::StartupOwned),
    ("runtime.file_roots", Ownership::StartupOwned),
    ("listeners.*.bind", Ownership::StartupOwned),
    ("listeners.*.protocol", Ownership::StartupOwned),
    ("listeners.*.http3", Ownership::StartupOwned),
    ("listeners.*.http3_early_data", Ownership::StartupOwned),
    (
        "listeners.*.tls.certificates",
        Ownership::CertificateMaterial,
    ),
    ("listeners.*.tls.client_ca", Ownership::CertificateMaterial),
    // A zone's folder: its files stay where the process found them.
    ("cache.zones.*.disk", Ownership::StartupOwned),
    ("cache.zones.*.disk.path", Ownership::StartupOwned),
];

/// The owner of the setting at `path` (a diff field path such as
/// `listeners.web.bind`).
pub fn ownership(path: &str) -> Ownership {
    ownership_of(&split_keys(path))
}

/// Split once: a change of 10 000 routes asks this for every field of
/// 20 000 entities.
fn ownership_of(keys: &[&str]) -> Ownership {
    OWNERSHIP
        .iter()
        .find(|(pattern, _)| keys_match(pattern, keys))
        .map_or(Ownership::GenerationOwned, |(_, owner)| *owner)
}

pub fn needs_restart(path: &str, from: &Value, to: &Value) -> bool {
    let keys = split_keys(path);
    if ownership_of(&keys) == Ownership::StartupOwned {
        return true;
    }
    keys_match("listeners.*.tls", &keys) && (from.is_null() != to.is_null())
}

fn keys_match(pattern: &str, keys: &[&str]) -> bool {
    let mut pattern_parts = pattern.split('.');
    let mut keys = keys.iter();
    loop {
        match (pattern_parts.next(), keys.next()) {
            (None, None) => return true,
            (Some("*"), Some(_)) => {}
            (Some(p), Some(k)) if p == *k => {}
            _ => return false,
        }
    }
}

fn split_keys(path: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut quoted = false;
    for (i, c) in path.char_indices() {
        match c {
            '"' => quoted = !quoted,
            '.' if !quoted => {
                out.push(&path[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&path[start..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn classifies_the_design_table() {
        assert_eq!(ownership("listeners.web.bind"), Ownership::StartupOwned);
        assert_eq!(ownership("admin.bind"), Ownership::StartupOwned);
        assert_eq!(ownership("log.level"), Ownership::GenerationOwned);
        assert_eq!(ownership("log.access"), Ownership::GenerationOwned);
        assert_eq!(ownership("log.access_file"), Ownership::StartupOwned);
        assert_eq!(ownership("metrics.max_series"), Ownership::StartupOwned);
        assert_eq!(ownership("tracing.otlp_endpoint"), Ownership::StartupOwned);
        assert_eq!(ownership("tracing.service_name"), Ownership::StartupOwned);
        assert_eq!(
            ownership("tracing.sample_ratio"),
            Ownership::GenerationOwned
        );
        assert_eq!(ownership("routes.api.timeout"), Ownership::GenerationOwned);
        assert_eq!(ownership("listeners.\"a.b\".bind"), Ownership::StartupOwned);
        assert_eq!(
            ownership("listeners.secure.tls.certificates"),
            Ownership::CertificateMaterial
        );
    }

    #[test]
    fn tls_on_off_needs_restart_but_rotation_does_not() {
        assert!(needs_restart(
            "listeners.web.tls",
            &Value::Null,
            &json!({"certificates": []})
        ));
        assert!(!needs_restart(
            "listeners.web.tls.certificates",
            &json!([1]),
            &json!([2])
        ));
        assert!(!needs_restart(
            "routes.api.upstream",
            &json!("a"),
            &json!("b")
        ));
    }
}
