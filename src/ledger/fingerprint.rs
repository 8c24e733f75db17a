//! A registration's fingerprint: the digest of its canonical JSON, so an
//! identical repeat is recognised without reading its children back.

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::model::NewChild;
use super::state::ExpiredLease;

/// Feeds a JSON value to the hasher with object keys sorted, so key order and
/// whitespace in the request never change the digest.
fn hash_value(hasher: &mut Sha256, value: &Value) {
    match value {
        Value::Null => hasher.update(b"n"),
        Value::Bool(b) => hasher.update(if *b { b"t" } else { b"f" }),
        Value::Number(n) => {
            hasher.update(b"#");
            hash_str(hasher, &n.to_string());
        }
        Value::String(s) => {
            hasher.update(b"s");
            hash_str(hasher, s);
        }
        Value::Array(items) => {
            hasher.update(b"[");
            hasher.update((items.len() as u64).to_le_bytes());
            for item in items {
                hash_value(hasher, item);
            }
        }
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            hasher.update(b"{");
            hasher.update((entries.len() as u64).to_le_bytes());
            for (key, item) in entries {
                hash_str(hasher, key);
                hash_value(hasher, item);
            }
        }
    }
}

fn hash_str(hasher: &mut Sha256, s: &str) {
    hasher.update((s.len() as u64).to_le_bytes());
    hasher.update(s.as_bytes());
}

fn hash_opt_str(hasher: &mut Sha256, s: Option<&str>) {
    match s {
        None => hasher.update(b"-"),
        Some(s) => {
            hasher.update(b"+");
            hash_str(hasher, s);
        }
    }
}

pub struct RegistrationContent<'a> {
    pub queue: &'a str,
    pub payload: Option<&'a Value>,
    pub decomposed: bool,
    pub max_attempts: Option<i32>,
    pub expired_lease: ExpiredLease,
    pub children: &'a [NewChild],
}

pub fn fingerprint(content: &RegistrationContent<'_>) -> String {
    let mut hasher = Sha256::new();
    hasher.update(b"child-ledger/registration/v1");
    hash_str(&mut hasher, content.queue);
    match content.payload {
        None => hasher.update(b"-"),
        Some(payload) => hash_value(&mut hasher, payload),
    }
    hasher.update([u8::from(content.decomposed)]);
    hasher.update(content.max_attempts.unwrap_or(-1).to_le_bytes());
    hash_str(&mut hasher, content.expired_lease.as_str());
    hasher.update((content.children.len() as u64).to_le_bytes());
    for child in content.children {
        hasher.update(child.sequence.to_le_bytes());
        hash_opt_str(&mut hasher, child.key.as_deref());
        hash_opt_str(&mut hasher, child.skip.as_deref());
        hash_value(&mut hasher, &child.payload);
    }
    let digest = hasher.finalize();
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn content<'a>(queue: &'a str, children: &'a [NewChild]) -> RegistrationContent<'a> {
        RegistrationContent {
            queue,
            payload: None,
            decomposed: true,
            max_attempts: None,
            expired_lease: ExpiredLease::Retry,
            children,
        }
    }

    fn child(payload: Value) -> NewChild {
        NewChild {
            sequence: 0,
            key: None,
            payload,
            skip: None,
        }
    }

    #[test]
    fn key_order_does_not_matter() {
        let a = [child(serde_json::from_str(r#"{"a":1,"b":[1,2]}"#).unwrap())];
        let b = [child(serde_json::from_str(r#"{ "b":[1,2], "a":1 }"#).unwrap())];
        assert_eq!(fingerprint(&content("q", &a)), fingerprint(&content("q", &b)));
    }

    #[test]
    fn any_content_change_changes_the_digest() {
        let base = [child(json!({"a": 1}))];
        let other_payload = [child(json!({"a": 2}))];
        let skipped = [NewChild {
            skip: Some("bad".into()),
            ..child(json!({"a": 1}))
        }];
        let keyed = [NewChild {
            key: Some("k".into()),
            ..child(json!({"a": 1}))
        }];
        let digest = fingerprint(&content("q", &base));
        assert_ne!(digest, fingerprint(&content("r", &base)));
        assert_ne!(digest, fingerprint(&content("q", &other_payload)));
        assert_ne!(digest, fingerprint(&content("q", &skipped)));
        assert_ne!(digest, fingerprint(&content("q", &keyed)));
        assert_ne!(digest, fingerprint(&content("q", &[])));
        let mut held = content("q", &base);
        held.expired_lease = ExpiredLease::Hold;
        assert_ne!(digest, fingerprint(&held));
    }

    #[test]
    fn string_and_number_do_not_collide() {
        assert_ne!(
            fingerprint(&content("q", &[child(json!("1"))])),
            fingerprint(&content("q", &[child(json!(1))]))
        );
    }
}
