//! Validated identifiers: nothing past the HTTP edge ever sees an invalid one.

use std::fmt;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Why an identifier was rejected; the caller names the field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidId(pub String);

impl fmt::Display for InvalidId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A client-chosen parent id: 1-200 chars of `A-Z a-z 0-9 . _ : ~ -`, other
/// than `.` and `..` (path segments that URL normalisers remove, so a URL
/// naming them would reach another route). The pattern says the same
/// without a lookahead, which not every validator has.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, ToSchema)]
#[serde(try_from = "String", into = "String")]
#[schema(
    value_type = String,
    pattern = r"^([A-Za-z0-9_:~-][A-Za-z0-9._:~-]{0,199}|\.[A-Za-z0-9_:~-][A-Za-z0-9._:~-]{0,198}|\.\.[A-Za-z0-9._:~-]{1,198})$",
    example = "P-42"
)]
pub struct ParentId(String);

impl ParentId {
    pub const MAX_LEN: usize = 200;

    pub fn parse(raw: &str) -> Result<Self, InvalidId> {
        let valid_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '~' | '-');
        if raw.is_empty() || raw.len() > Self::MAX_LEN {
            return Err(InvalidId(format!(
                "must be 1-{} characters, got {}",
                Self::MAX_LEN,
                raw.chars().count()
            )));
        }
        if let Some(bad) = raw.chars().find(|c| !valid_char(*c)) {
            return Err(InvalidId(format!(
                "may only contain A-Z a-z 0-9 . _ : ~ -, found {bad:?}"
            )));
        }
        if raw == "." || raw == ".." {
            return Err(InvalidId(format!(
                "{raw:?} is a path segment URL normalisers remove, so no URL could name it reliably"
            )));
        }
        Ok(Self(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// An id read back from the ledger, where only valid ids are ever written.
    pub(crate) fn from_ledger(raw: String) -> Self {
        Self(raw)
    }
}

impl TryFrom<String> for ParentId {
    type Error = InvalidId;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::parse(&value)
    }
}

impl From<ParentId> for String {
    fn from(value: ParentId) -> Self {
        value.0
    }
}

impl fmt::Display for ParentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A queue name: 1-64 chars of `a-z 0-9 . _ -`, not only dots.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(try_from = "String", into = "String")]
#[schema(value_type = String, pattern = "^[a-z0-9._-]{1,64}$", example = "events")]
pub struct QueueName(String);

impl QueueName {
    pub const MAX_LEN: usize = 64;

    pub fn parse(raw: &str) -> Result<Self, InvalidId> {
        let valid_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-');
        if raw.is_empty() || raw.len() > Self::MAX_LEN {
            return Err(InvalidId(format!(
                "must be 1-{} characters, got {}",
                Self::MAX_LEN,
                raw.chars().count()
            )));
        }
        if let Some(bad) = raw.chars().find(|c| !valid_char(*c)) {
            return Err(InvalidId(format!("may only contain a-z 0-9 . _ -, found {bad:?}")));
        }
        if only_dots(raw) {
            return Err(InvalidId(format!(
                "{raw:?} is made only of dots: clients and proxies that normalise paths rewrite such a \
                 segment, so no URL could name it reliably"
            )));
        }
        Ok(Self(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A name read back from the ledger, where only valid names are ever written.
    pub(crate) fn from_ledger(raw: String) -> Self {
        Self(raw)
    }
}

impl Default for QueueName {
    fn default() -> Self {
        Self("default".to_owned())
    }
}

impl TryFrom<String> for QueueName {
    type Error = InvalidId;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::parse(&value)
    }
}

impl From<QueueName> for String {
    fn from(value: QueueName) -> Self {
        value.0
    }
}

impl fmt::Display for QueueName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The idempotency key workers pass to remote APIs: stable across attempts.
pub fn idempotency_key(parent_id: &str, sequence: i64) -> String {
    format!("{parent_id}/{sequence}")
}

/// A name made only of dots (`.`, `..`, `...`): a path segment that URL
/// normalisers remove or rewrite, so a request meant for it reaches another
/// resource.
pub fn only_dots(raw: &str) -> bool {
    !raw.is_empty() && raw.bytes().all(|b| b == b'.')
}

/// A name that would move a request to another path when put in a URL: made
/// only of dots, or holding `/`. Refused with 422 wherever a name is taken.
pub fn traverses(raw: &str) -> bool {
    only_dots(raw) || raw.contains('/')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parent_ids_follow_the_contract() {
        assert!(ParentId::parse("P-42").is_ok());
        assert!(ParentId::parse("a.b_c:d~e-F9").is_ok());
        assert!(ParentId::parse(&"x".repeat(200)).is_ok());
        assert!(ParentId::parse(&"x".repeat(201)).is_err());
        assert!(ParentId::parse("").is_err());
        assert!(ParentId::parse("has space").is_err());
        assert!(ParentId::parse("slash/no").is_err());
        assert!(ParentId::parse("é").is_err());
        assert!(ParentId::parse(".").is_err());
        assert!(ParentId::parse("..").is_err());
        for fine in ["...", ".a", "..a", "a.", "a..", ".-", "~"] {
            assert!(ParentId::parse(fine).is_ok(), "{fine}");
        }
    }

    #[test]
    fn queue_names_are_lowercase() {
        assert!(QueueName::parse("events.v2_x-1").is_ok());
        assert!(QueueName::parse("Events").is_err());
        assert!(QueueName::parse(&"q".repeat(65)).is_err());
        assert_eq!(QueueName::default().as_str(), "default");
    }

    #[test]
    fn idempotency_key_is_parent_slash_sequence() {
        assert_eq!(idempotency_key("P-42", 7), "P-42/7");
    }
}
