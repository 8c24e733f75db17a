//! W3C trace context (`traceparent`): what a registration may carry for its
//! parent and each child, kept and handed back on every claimed child.

/// A valid `traceparent`, lower-cased: `00-<32 hex trace id>-<16 hex parent
/// id>-<2 hex flags>` (a later version may add fields after the flags, which
/// are kept); an all-zero trace or parent id, or version `ff`, is not one.
pub fn parse_traceparent(raw: &str) -> Result<String, String> {
    let value = raw.trim().to_ascii_lowercase();
    let parts: Vec<&str> = value.split('-').collect();
    let hex = |s: &str, len: usize| s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit());
    let shape = "must be a W3C traceparent: 00-<32 hex trace id>-<16 hex span id>-<2 hex flags>";
    if parts.len() < 4 || !hex(parts[0], 2) || !hex(parts[1], 32) || !hex(parts[2], 16) || !hex(parts[3], 2) {
        return Err(shape.to_owned());
    }
    if parts[0] == "ff" || (parts[0] == "00" && parts.len() != 4) {
        return Err(shape.to_owned());
    }
    if parts[1].bytes().all(|b| b == b'0') || parts[2].bytes().all(|b| b == b'0') {
        return Err("must not have an all-zero trace id or span id".to_owned());
    }
    if value.len() > 256 {
        return Err(shape.to_owned());
    }
    Ok(value)
}

/// A child's `traceparent` field as the API document describes it (the
/// pattern `^[0-9a-fA-F]{2}-[0-9a-fA-F]{32}-[0-9a-fA-F]{16}-[0-9a-fA-F]{2}$`):
/// anything else is refused, naming the shape. One of that shape that W3C
/// says to ignore (version `ff`, an all-zero trace or span id) is kept as
/// none, as an invalid `traceparent` header is.
pub fn traceparent_field(raw: &str) -> Result<Option<String>, String> {
    let shaped = raw.len() == 55
        && raw.split('-').map(str::len).eq([2, 32, 16, 2])
        && raw.bytes().all(|b| b == b'-' || b.is_ascii_hexdigit());
    if !shaped {
        return Err(
            "must be a W3C traceparent: <2 hex version>-<32 hex trace id>-<16 hex span id>-<2 hex flags>".to_owned(),
        );
    }
    Ok(parse_traceparent(raw).ok())
}

/// The trace id of a valid `traceparent`.
pub fn trace_id(traceparent: &str) -> &str {
    traceparent.split('-').nth(1).unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_w3c_traceparents_parse() {
        let ok = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(parse_traceparent(ok).unwrap(), ok);
        assert_eq!(parse_traceparent(&ok.to_uppercase()).unwrap(), ok);
        assert_eq!(trace_id(ok), "4bf92f3577b34da6a3ce929d0e0e4736");
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
        ] {
            assert!(parse_traceparent(bad).is_err(), "{bad:?}");
        }
        assert!(parse_traceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-later").is_ok());
    }

    #[test]
    fn a_child_field_is_refused_only_off_the_documented_shape() {
        let ok = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(traceparent_field(ok).unwrap().as_deref(), Some(ok));
        assert_eq!(traceparent_field(&ok.to_uppercase()).unwrap().as_deref(), Some(ok));
        for ignored in [
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(traceparent_field(ignored).unwrap(), None, "{ignored:?}");
        }
        for bad in [
            "",
            " 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-later",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "00+4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert!(traceparent_field(bad).is_err(), "{bad:?}");
        }
    }
}
