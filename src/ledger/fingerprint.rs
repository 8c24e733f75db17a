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

/// Feeds JSON text to the hasher without the whitespace between tokens, so a
/// re-serialised but identical payload hashes the same.
fn hash_json_text(hasher: &mut Sha256, text: &str) {
    let minified = minify_json(text);
    hasher.update((minified.len() as u64).to_le_bytes());
    hasher.update(&minified);
}

/// JSON text without the whitespace between tokens: two payloads are the same
/// content when their minified texts are equal (member order counts).
pub fn minify_json(text: &str) -> Vec<u8> {
    let mut minified = Vec::with_capacity(text.len());
    let (mut in_string, mut escaped) = (false, false);
    for &b in text.as_bytes() {
        if in_string {
            minified.push(b);
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
        } else if !b.is_ascii_whitespace() {
            in_string = b == b'"';
            minified.push(b);
        }
    }
    minified
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
    pub priority: i32,
    pub webhook_url: Option<&'a str>,
    pub admission: &'a super::admission::ParentAdmission,
    pub tolerance: Option<super::verdict::Tolerance>,
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
    // Hashed only when set, so registrations from before priorities keep their digest.
    if content.priority != 0 {
        hasher.update(b"priority");
        hasher.update(content.priority.to_le_bytes());
    }
    // Likewise only when set.
    if let Some(url) = content.webhook_url {
        hasher.update(b"webhook_url");
        hash_str(&mut hasher, url);
    }
    // Admission likewise, member by member.
    let admission = content.admission;
    if let Some(at) = admission.not_before {
        hasher.update(b"not_before");
        hasher.update(at.timestamp_micros().to_le_bytes());
    }
    if let Some(key) = &admission.flow_key {
        hasher.update(b"flow_key");
        hash_str(&mut hasher, key);
    }
    if let Some(backoff) = admission.retry_backoff {
        hasher.update(b"retry_backoff");
        hasher.update(backoff.initial_seconds.to_le_bytes());
        hasher.update(backoff.max_seconds.to_le_bytes());
    }
    match content.tolerance {
        None => {}
        Some(super::verdict::Tolerance::Count(count)) => {
            hasher.update(b"tolerated_failures.count");
            hasher.update(count.to_le_bytes());
        }
        Some(super::verdict::Tolerance::Percent(percent)) => {
            hasher.update(b"tolerated_failures.percent");
            hasher.update(percent.to_le_bytes());
        }
    }
    hasher.update((content.children.len() as u64).to_le_bytes());
    for child in content.children {
        hasher.update(child.sequence.to_le_bytes());
        hash_opt_str(&mut hasher, child.key.as_deref());
        hash_opt_str(&mut hasher, child.skip.as_deref());
        hash_json_text(&mut hasher, child.payload.get());
        if let Some(at) = child.not_before {
            hasher.update(b"not_before");
            hasher.update(at.timestamp_micros().to_le_bytes());
        }
    }
    let digest = hasher.finalize();
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    static NO_ADMISSION: crate::ledger::admission::ParentAdmission = crate::ledger::admission::ParentAdmission {
        not_before: None,
        flow_key: None,
        retry_backoff: None,
    };

    fn content<'a>(queue: &'a str, children: &'a [NewChild]) -> RegistrationContent<'a> {
        RegistrationContent {
            queue,
            payload: None,
            decomposed: true,
            max_attempts: None,
            expired_lease: ExpiredLease::Retry,
            priority: 0,
            tolerance: None,
            webhook_url: None,
            admission: &NO_ADMISSION,
            children,
        }
    }

    fn child(payload: Value) -> NewChild {
        NewChild {
            sequence: 0,
            key: None,
            payload: serde_json::value::to_raw_value(&payload).unwrap(),
            skip: None,
            traceparent: None,
            not_before: None,
        }
    }

    fn raw_child(text: &str) -> NewChild {
        NewChild {
            sequence: 0,
            key: None,
            payload: serde_json::from_str(text).unwrap(),
            skip: None,
            traceparent: None,
            not_before: None,
        }
    }

    #[test]
    fn whitespace_between_tokens_does_not_matter() {
        let a = [raw_child(r#"{"a":1,"b":[1,2],"s":"x y"}"#)];
        let b = [raw_child("{ \"a\" : 1,\n \"b\": [1, 2], \"s\": \"x y\" }")];
        assert_eq!(fingerprint(&content("q", &a)), fingerprint(&content("q", &b)));
        // Whitespace inside strings, and escaped quotes, are content.
        let c = [raw_child(r#"{"a":1,"b":[1,2],"s":"x  y"}"#)];
        assert_ne!(fingerprint(&content("q", &a)), fingerprint(&content("q", &c)));
        let d = [raw_child(r#"{"s":"a\" b"}"#)];
        let e = [raw_child(r#"{"s":"a\"b"}"#)];
        assert_ne!(fingerprint(&content("q", &d)), fingerprint(&content("q", &e)));
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
        let mut urgent = content("q", &base);
        urgent.priority = 5;
        assert_ne!(digest, fingerprint(&urgent));
        let mut hooked = content("q", &base);
        hooked.webhook_url = Some("https://hooks.example.com/done");
        assert_ne!(digest, fingerprint(&hooked));
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
