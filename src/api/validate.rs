//! Checks on request values beyond their types: ranges, lengths, byte sizes,
//! storable JSON, page sizes and the children of a registration or append.
//! Each failure names the field at fault.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::error::{ApiError, ApiResult};
use crate::ledger::NewChild;
use crate::ledger::fingerprint::minify_json;

/// The longest key a child may have.
pub const MAX_KEY_CHARS: usize = 200;
/// The longest reason (skip, failure) in characters.
pub const MAX_REASON_CHARS: usize = 1000;
/// The longest worker label.
pub const MAX_WORKER_CHARS: usize = 200;
/// The largest page of a list.
pub const MAX_PAGE: i64 = 1000;
/// The page size when none is asked for.
pub const DEFAULT_PAGE: i64 = 100;

/// A list's page size: `DEFAULT_PAGE` when none is given, at most `MAX_PAGE`.
pub fn page_limit(limit: Option<i64>) -> ApiResult<i64> {
    let limit = limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::bad_request(
            "limit",
            format!("must be between 1 and {MAX_PAGE}, got {limit}"),
        ));
    }
    Ok(limit)
}

/// Checks the children of one request: keys unique within it, reasons and
/// payloads within their limits, turning each into a ledger row.
pub struct ChildChecker {
    keys: HashMap<String, i64>,
    max_payload_bytes: usize,
}

/// A child's members as sent, before `ChildChecker::check`.
pub struct ChildFields {
    pub payload: Option<Box<RawValue>>,
    pub key: Option<String>,
    pub skip: Option<String>,
    pub traceparent: Option<String>,
    pub not_before: Option<DateTime<Utc>>,
}

impl ChildChecker {
    pub fn new(max_payload_bytes: usize) -> Self {
        Self {
            keys: HashMap::new(),
            max_payload_bytes,
        }
    }

    pub fn check(&mut self, field: &str, sequence: i64, fields: ChildFields) -> ApiResult<NewChild> {
        let ChildFields {
            payload,
            key,
            skip,
            traceparent,
            not_before,
        } = fields;
        if let Some(key) = &key {
            if key.is_empty() {
                return Err(ApiError::invalid(format!("{field}.key"), "must not be empty"));
            }
            max_chars(&format!("{field}.key"), key, MAX_KEY_CHARS)?;
            if let Some(first) = self.keys.insert(key.clone(), sequence) {
                return Err(ApiError::duplicate_key_in_request(field, key, first));
            }
        }
        if let Some(skip) = &skip {
            if skip.is_empty() {
                return Err(ApiError::invalid(format!("{field}.skip"), "must be a non-empty reason"));
            }
            max_chars(&format!("{field}.skip"), skip, MAX_REASON_CHARS)?;
        }
        let payload = match payload {
            Some(payload) => {
                // Measured compact, as the parent payload is.
                raw_json_within(&format!("{field}.payload"), &payload, self.max_payload_bytes)?;
                payload
            }
            None => null_payload(),
        };
        let traceparent = match traceparent {
            Some(t) => crate::ledger::trace::traceparent_field(&t)
                .map_err(|why| ApiError::invalid(format!("{field}.traceparent"), why))?,
            None => None,
        };
        Ok(NewChild {
            not_before,
            sequence,
            key,
            payload,
            skip,
            traceparent,
        })
    }
}

/// Checks raw JSON against a byte limit, measured compact (minified only
/// when the text as sent is over it), and that every store can keep it.
pub fn raw_json_within(field: &str, raw: &RawValue, max: usize) -> ApiResult<()> {
    let mut len = raw.get().len();
    if len > max {
        len = minify_json(raw.get()).len();
    }
    max_bytes(field, len, max)?;
    storable_json(field, raw.get())
}

/// The payload of a child that was sent without one.
pub fn null_payload() -> Box<RawValue> {
    serde_json::value::to_raw_value(&Value::Null).expect("null is JSON")
}

/// A request's list of children. The body's first reading only checks that
/// the list is JSON and builds nothing; `read` then builds the children from
/// the body again with the request's bound (`--max-children-per-request`), so
/// a body that claims millions is refused after reading the allowed number,
/// not after building them all, and holds no copy of its text.
#[derive(Debug)]
pub struct ChildList<T> {
    pub items: Vec<T>,
}

impl<T> Default for ChildList<T> {
    fn default() -> Self {
        Self { items: Vec::new() }
    }
}

impl<'de, T> serde::Deserialize<'de> for ChildList<T> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        <serde::de::IgnoredAny as serde::Deserialize>::deserialize(deserializer)?;
        Ok(Self::default())
    }
}

impl<T: serde::de::DeserializeOwned> ChildList<T> {
    /// Builds the children of member `field` of the JSON object `body`, at
    /// most `max` of them.
    /// Read without tracking the path first (see `extract::parse_json`);
    /// only children that fail are read again, for the path.
    pub fn read(&mut self, body: &[u8], field: &'static str, max: usize) -> ApiResult<()> {
        let seed = || Member::<T> {
            field,
            max,
            items: std::marker::PhantomData,
        };
        let mut json = serde_json::Deserializer::from_slice(body);
        if let Ok(items) = serde::de::DeserializeSeed::deserialize(seed(), &mut json) {
            self.items = items;
            return Ok(());
        }
        let mut json = serde_json::Deserializer::from_slice(body);
        let mut track = serde_path_to_error::Track::new();
        let read = serde::de::DeserializeSeed::deserialize(
            seed(),
            serde_path_to_error::Deserializer::new(&mut json, &mut track),
        );
        self.items = read.map_err(|err| super::extract::json_error(track.path().to_string(), err))?;
        Ok(())
    }
}

/// The children of one member of a JSON object; the other members skipped.
struct Member<T> {
    field: &'static str,
    max: usize,
    items: std::marker::PhantomData<T>,
}

impl<'de, T: serde::Deserialize<'de>> serde::de::DeserializeSeed<'de> for Member<T> {
    type Value = Vec<T>;

    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<Vec<T>, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de, T: serde::Deserialize<'de>> serde::de::Visitor<'de> for Member<T> {
    type Value = Vec<T>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Vec<T>, A::Error> {
        let mut items = Vec::new();
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if key == self.field {
                items = map.next_value_seed(Bounded {
                    max: self.max,
                    items: std::marker::PhantomData,
                })?;
            } else {
                map.next_value::<serde::de::IgnoredAny>()?;
            }
        }
        Ok(items)
    }
}

/// Reads an array of children, refusing it past `max` items.
struct Bounded<T> {
    max: usize,
    items: std::marker::PhantomData<T>,
}

impl<'de, T: serde::Deserialize<'de>> serde::de::DeserializeSeed<'de> for Bounded<T> {
    type Value = Vec<T>;

    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<Vec<T>, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de, T: serde::Deserialize<'de>> serde::de::Visitor<'de> for Bounded<T> {
    type Value = Vec<T>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an array of children")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
        let max = self.max;
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(max).min(4096));
        while let Some(item) = seq.next_element()? {
            if items.len() == max {
                return Err(serde::de::Error::custom(format!(
                    "more than {max} children in one request (use append + seal beyond that)"
                )));
            }
            items.push(item);
        }
        Ok(items)
    }
}

pub fn child_count(field: &str, count: usize, max: usize) -> ApiResult<()> {
    if count > max {
        return Err(ApiError::invalid(
            field,
            format!("{count} children in one request; at most {max} (use append + seal beyond that)"),
        ));
    }
    Ok(())
}

/// Checks a number against an inclusive range, naming the field when it is out.
pub fn in_range<T>(field: &str, value: T, min: T, max: T) -> Result<T, ApiError>
where
    T: PartialOrd + std::fmt::Display + Copy,
{
    if value < min || value > max {
        return Err(ApiError::invalid(
            field,
            format!("must be between {min} and {max}, got {value}"),
        ));
    }
    Ok(value)
}

/// Checks a string's length in characters.
pub fn max_chars(field: &str, value: &str, max: usize) -> Result<(), ApiError> {
    let len = value.chars().count();
    if len > max {
        return Err(ApiError::invalid(
            field,
            format!("must be at most {max} characters, got {len}"),
        ));
    }
    Ok(())
}

/// Checks that raw JSON (kept as text, so far only checked for syntax) is
/// JSON every store can keep and give back: no lone UTF-16 surrogate in a
/// string escape and no number beyond the range of a double.
pub fn storable_json(field: &str, text: &str) -> Result<(), ApiError> {
    use serde::Deserializer as _;
    use serde::de::{self, MapAccess, SeqAccess, Visitor};

    /// Reads every value fully (strings decoded, numbers parsed) and keeps nothing.
    struct Storable;

    impl<'de> Visitor<'de> for Storable {
        type Value = ();

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("any JSON value")
        }
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
            Ok(())
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
            Ok(())
        }
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
            Ok(())
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
            Ok(())
        }
        fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
            Ok(())
        }
        fn visit_unit<E: de::Error>(self) -> Result<(), E> {
            Ok(())
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            while seq.next_element_seed(StorableSeed)?.is_some() {}
            Ok(())
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            while map.next_key_seed(StorableSeed)?.is_some() {
                map.next_value_seed(StorableSeed)?;
            }
            Ok(())
        }
    }

    struct StorableSeed;

    impl<'de> de::DeserializeSeed<'de> for StorableSeed {
        type Value = ();
        fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_any(Storable)
        }
    }

    let mut de = serde_json::Deserializer::from_str(text);
    (&mut de)
        .deserialize_any(Storable)
        .map_err(|e| ApiError::invalid(field, format!("cannot be stored: {e}")))
}

/// Checks the size of a JSON value, in bytes.
pub fn max_bytes(field: &str, len: usize, max: usize) -> Result<(), ApiError> {
    if len > max {
        return Err(ApiError::invalid(
            field,
            format!("must be at most {max} bytes of JSON, got {len}"),
        ));
    }
    Ok(())
}
