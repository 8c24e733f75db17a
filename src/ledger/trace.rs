//! W3C trace context (`traceparent`): what a registration may carry for its
//! parent and each child, kept and handed back on every claimed child.

/// A `traceparent` as W3C Trace Context level 1 reads it, for every version,
/// lower-cased and in the version this service speaks: `00-<32 hex trace
/// id>-<16 hex parent id>-<2 hex flags>`. Version `00` has exactly those
/// four fields; a later version may add fields after the flags (the flags
/// then end at a `-`), which are dropped, never handed on. Version `ff`, an
/// all-zero trace or parent id are not a trace context.
pub fn parse_traceparent(raw: &str) -> Result<String, String> {
    let value = raw.trim().to_ascii_lowercase();
    let shape = "must be a W3C traceparent: 00-<32 hex trace id>-<16 hex span id>-<2 hex flags>";
    let hex = |s: &str| s.bytes().all(|b| b.is_ascii_hexdigit());
    // <version>-<trace id>-<parent id>-<flags>: 55 characters, then either
    // nothing (every version) or `-` and a later version's fields.
    let (head, rest) = value.split_at(value.len().min(55));
    let fields: Vec<&str> = head.split('-').collect();
    let shaped = head.len() == 55 && fields.iter().map(|f| f.len()).eq([2, 32, 16, 2]) && fields.iter().all(|f| hex(f));
    if !shaped || value.len() > 256 {
        return Err(shape.to_owned());
    }
    let (version, trace, parent, flags) = (fields[0], fields[1], fields[2], fields[3]);
    if version == "ff" || (version == "00" && !rest.is_empty()) || !(rest.is_empty() || rest.starts_with('-')) {
        return Err(shape.to_owned());
    }
    if trace.bytes().all(|b| b == b'0') || parent.bytes().all(|b| b == b'0') {
        return Err("must not have an all-zero trace id or span id".to_owned());
    }
    Ok(format!("00-{trace}-{parent}-{flags}"))
}

/// A child's `traceparent` field as the API document describes it (the
/// pattern `^[0-9a-fA-F]{2}-[0-9a-fA-F]{32}-[0-9a-fA-F]{16}-[0-9a-fA-F]{2}$`,
/// so no later version's extra fields): anything else is refused, naming
/// the shape. What passes is read by `parse_traceparent`, as the header is;
/// one W3C says to ignore (version `ff`, an all-zero trace or span id) is
/// kept as none, as such a header is.
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
        // A later version: its extra fields are dropped, and it is handed on
        // in the version this service speaks.
        for later in [
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-later",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-\"><img src=x onerror=alert(1)>",
        ] {
            assert_eq!(parse_traceparent(later).unwrap(), ok, "{later:?}");
        }
        for bad in [
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01later",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        ] {
            assert!(parse_traceparent(bad).is_err(), "{bad:?}");
        }
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
