//! Integer fields as JSON Schema reads them: `5` and `5.0` are the same integer,
//! `5.5` is not one. Use with `#[serde(deserialize_with = "whole::required")]`,
//! or `#[serde(default, deserialize_with = "whole::option")]`.

use std::fmt;

use serde::Deserializer;
use serde::de::{Error, Visitor};

struct Whole;

impl Visitor<'_> for Whole {
    type Value = i64;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an integer")
    }

    fn visit_i64<E: Error>(self, v: i64) -> Result<i64, E> {
        Ok(v)
    }

    fn visit_u64<E: Error>(self, v: u64) -> Result<i64, E> {
        i64::try_from(v).map_err(|_| E::custom(format!("{v} is out of range")))
    }

    fn visit_f64<E: Error>(self, v: f64) -> Result<i64, E> {
        // 2^63 itself does not fit; every float below it with no fraction does.
        if v.fract() == 0.0 && (-9_223_372_036_854_775_808.0..9_223_372_036_854_775_808.0).contains(&v) {
            Ok(v as i64)
        } else {
            Err(E::custom(format!("expected an integer, got {v}")))
        }
    }
}

pub fn required<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<i64>,
{
    let v = deserializer.deserialize_any(Whole)?;
    T::try_from(v).map_err(|_| D::Error::custom(format!("{v} is out of range")))
}

pub fn option<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<i64>,
{
    struct Maybe;
    impl<'de> Visitor<'de> for Maybe {
        type Value = Option<i64>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("an integer or null")
        }
        fn visit_none<E: Error>(self) -> Result<Option<i64>, E> {
            Ok(None)
        }
        fn visit_unit<E: Error>(self) -> Result<Option<i64>, E> {
            Ok(None)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Option<i64>, D::Error> {
            d.deserialize_any(Whole).map(Some)
        }
    }
    match deserializer.deserialize_option(Maybe)? {
        None => Ok(None),
        Some(v) => T::try_from(v)
            .map(Some)
            .map_err(|_| D::Error::custom(format!("{v} is out of range"))),
    }
}
