//! The allow-list: which caller may call which gRPC method of a service.
//!
//! It is declared once, in `services.toml` at the repository root, by the callers: each
//! `[[service]]` that `calls` another names the methods it calls in its
//! `[service.rpcs]` table, as `Service/Method` (`PaymentService/Charge`) or `Service/*`
//! (every method of that gRPC service):
//!
//! ```toml
//! [service.rpcs]
//! payment = ["PaymentService/Charge", "PaymentService/Refund"]
//! ```
//!
//! Each service binary compiles the file in and hands it over
//! (`sagaworks_runtime::services_toml!`, [`Policy::parse`]): this library reads no
//! deployment file itself, and a deployment cannot loosen the policy by configuration;
//! changing who may call what is a reviewed change of that file. A method no caller
//! declares is refused to everyone.

use serde::Deserialize;
use std::collections::BTreeMap;

#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("services.toml: {0}")]
    Toml(#[from] toml::de::Error),
    #[error("services.toml: {caller} declares rpcs of {callee}, which is not in its calls")]
    NotCalled { caller: String, callee: String },
    #[error("services.toml: {caller} calls {callee} but declares none of its rpcs")]
    NoRpcs { caller: String, callee: String },
    #[error("services.toml: {caller}'s rpcs of {callee}: {pattern:?} is not Service/Method or Service/*")]
    Pattern { caller: String, callee: String, pattern: String },
}

/// The part of services.toml the policy reads (the rest is other readers' business).
#[derive(Deserialize)]
struct File {
    service: Vec<Entry>,
}

#[derive(Deserialize)]
struct Entry {
    name: String,
    #[serde(default)]
    topics: Vec<String>,
    #[serde(default)]
    calls: Vec<String>,
    #[serde(default)]
    rpcs: BTreeMap<String, Vec<String>>,
}

/// Per topic (aggregate type) of `services_toml`, the `ce_source` of its publisher,
/// `/sagaworks/<service>`: what a consumer accepts on it
/// (`sagaworks_outbox::ConsumerSettings::sources`).
pub fn topic_sources(services_toml: &str) -> Result<BTreeMap<String, String>, PolicyError> {
    let file: File = toml::from_str(services_toml)?;
    Ok(file
        .service
        .iter()
        .flat_map(|s| s.topics.iter().map(move |t| (t.clone(), format!("/sagaworks/{}", s.name))))
        .collect())
}

/// Who may call which method of one service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    service: String,
    /// (caller, `Service/Method` or `Service/*`)
    rules: Vec<(String, String)>,
}

fn valid_pattern(pattern: &str) -> bool {
    let ident = |s: &str| {
        s.starts_with(|c: char| c.is_ascii_uppercase()) && s.chars().all(|c| c.is_ascii_alphanumeric())
    };
    match pattern.split_once('/') {
        Some((service, method)) => ident(service) && (method == "*" || ident(method)),
        None => false,
    }
}

/// `/sagaworks.payment.v1.PaymentService/Charge` -> (`PaymentService`, `Charge`).
fn split_path(path: &str) -> Option<(&str, &str)> {
    let (service, method) = path.strip_prefix('/')?.split_once('/')?;
    Some((service.rsplit('.').next()?, method))
}

impl Policy {
    /// The policy of `service` in `services_toml` (checking every entry's rpcs, not only
    /// those naming `service`).
    pub fn parse(services_toml: &str, service: &str) -> Result<Self, PolicyError> {
        let file: File = toml::from_str(services_toml)?;
        let mut rules = Vec::new();
        for entry in &file.service {
            for callee in &entry.calls {
                if !entry.rpcs.contains_key(callee) {
                    return Err(PolicyError::NoRpcs { caller: entry.name.clone(), callee: callee.clone() });
                }
            }
            for (callee, patterns) in &entry.rpcs {
                if !entry.calls.contains(callee) {
                    return Err(PolicyError::NotCalled {
                        caller: entry.name.clone(),
                        callee: callee.clone(),
                    });
                }
                for pattern in patterns {
                    if !valid_pattern(pattern) {
                        return Err(PolicyError::Pattern {
                            caller: entry.name.clone(),
                            callee: callee.clone(),
                            pattern: pattern.clone(),
                        });
                    }
                    if callee == service {
                        rules.push((entry.name.clone(), pattern.clone()));
                    }
                }
            }
        }
        Ok(Self { service: service.to_owned(), rules })
    }

    /// The service this policy guards.
    pub fn service(&self) -> &str {
        &self.service
    }

    fn matching<'a>(&'a self, path: &'a str) -> impl Iterator<Item = &'a (String, String)> + 'a {
        let split = split_path(path);
        self.rules.iter().filter(move |(_, pattern)| match (split, pattern.split_once('/')) {
            (Some((service, method)), Some((s, m))) => s == service && (m == "*" || m == method),
            _ => false,
        })
    }

    /// Whether `caller` may call the method at `path` (`/package.Service/Method`).
    pub fn allows(&self, caller: &str, path: &str) -> bool {
        self.matching(path).any(|(who, _)| who == caller)
    }

    /// Whether any caller may call `path` (the method is one this policy knows).
    pub fn knows(&self, path: &str) -> bool {
        self.matching(path).next().is_some()
    }

    /// The callers admitted to some method, sorted, without repeats.
    pub fn callers(&self) -> Vec<&str> {
        let mut callers: Vec<&str> = self.rules.iter().map(|(c, _)| c.as_str()).collect();
        callers.sort_unstable();
        callers.dedup();
        callers
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"
[[service]]
name = "payment"
calls = []

[[service]]
name = "order"
calls = ["payment"]
[service.rpcs]
payment = ["PaymentService/Charge", "PaymentService/Refund"]

[[service]]
name = "gateway"
calls = ["payment"]
[service.rpcs]
payment = ["PaymentService/GetAccount", "DeadLetterService/*"]
"#;

    #[test]
    fn a_method_admits_exactly_the_callers_that_declare_it() {
        let p = Policy::parse(FILE, "payment").unwrap();
        assert!(p.allows("order", "/sagaworks.payment.v1.PaymentService/Charge"));
        assert!(p.allows("order", "/sagaworks.payment.v1.PaymentService/Refund"));
        assert!(!p.allows("gateway", "/sagaworks.payment.v1.PaymentService/Refund"));
        assert!(!p.allows("order", "/sagaworks.payment.v1.PaymentService/GetAccount"));
        assert!(p.allows("gateway", "/sagaworks.deadletter.v1.DeadLetterService/Replay"));
        assert!(!p.allows("order", "/sagaworks.deadletter.v1.DeadLetterService/Replay"));
        assert!(!p.allows("order", "/sagaworks.payment.v1.PaymentService/AddCredit"), "undeclared: nobody");
        assert!(!p.allows("gateway", "/sagaworks.payment.v1.PaymentService/AddCredit"));
        assert!(!p.allows("order", "not a path"));
        assert!(p.knows("/x.PaymentService/Charge") && !p.knows("/x.PaymentService/AddCredit"));
        assert_eq!(p.callers(), ["gateway", "order"]);
        assert!(Policy::parse(FILE, "order").unwrap().callers().is_empty());
    }

    #[test]
    fn a_malformed_declaration_is_an_error() {
        let not_called = FILE.replace(
            "calls = [\"payment\"]\n[service.rpcs]\npayment = [\"PaymentService/G",
            "calls = []\n[service.rpcs]\npayment = [\"PaymentService/G",
        );
        assert!(matches!(Policy::parse(&not_called, "payment"), Err(PolicyError::NotCalled { .. })));
        let no_rpcs = FILE.replace(
            "[service.rpcs]\npayment = [\"PaymentService/Ch",
            "[service.x]\npayment = [\"PaymentService/Ch",
        );
        assert!(matches!(Policy::parse(&no_rpcs, "payment"), Err(PolicyError::NoRpcs { .. })));
        let bad = FILE.replace("PaymentService/Refund", "Refund");
        assert!(matches!(Policy::parse(&bad, "payment"), Err(PolicyError::Pattern { .. })));
    }

    #[test]
    fn the_repositorys_services_toml_is_well_formed() {
        let file =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../services.toml")).unwrap();
        for service in ["order", "inventory", "payment", "gateway"] {
            Policy::parse(&file, service).unwrap();
        }
        let sources = topic_sources(&file).unwrap();
        assert_eq!(sources["order"], "/sagaworks/order");
        assert_eq!(sources["reservation"], "/sagaworks/inventory");
        assert_eq!(sources["payment"], "/sagaworks/payment");
        let payment = Policy::parse(&file, "payment").unwrap();
        assert_eq!(payment.callers(), ["gateway", "order"]);
        assert!(payment.allows("order", "/sagaworks.payment.v1.PaymentService/Charge"));
        assert!(!payment.allows("gateway", "/sagaworks.payment.v1.PaymentService/Refund"));
    }
}
