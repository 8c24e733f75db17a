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
}
