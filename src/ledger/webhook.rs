//! Completion webhooks, the pure rules: which hosts a `webhook_url` may name
//! (SSRF), the Standard Webhooks signature, and the retry schedule.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The retry delays after each failed attempt: about 5 s, 5 min, 30 min, 2 h,
/// 5 h, 10 h, 10 h; after the last, the event is given up (`failed`).
pub const DEFAULT_RETRY_SCHEDULE_MS: [u64; 7] =
    [5_000, 300_000, 1_800_000, 7_200_000, 18_000_000, 36_000_000, 36_000_000];

/// Host patterns a `webhook_url` must match (`--webhook-allow-hosts`):
/// `host`, `host:port`, `*.domain` (any subdomain) or `*.domain:port`. Empty:
/// no `webhook_url` is accepted.
#[derive(Debug, Clone, Default)]
pub struct AllowHosts(Vec<String>);

impl AllowHosts {
    /// Comma-separated patterns; blanks are ignored.
    pub fn parse(list: &str) -> Self {
        Self(
            list.split(',')
                .map(|p| p.trim().to_ascii_lowercase())
                .filter(|p| !p.is_empty())
                .collect(),
        )
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Checks a `webhook_url`: absolute `http`/`https`, no credentials, and a
    /// host (or `host:port`) one of the patterns allows. The error says why not.
    pub fn check(&self, raw: &str) -> Result<url::Url, String> {
        let url = url::Url::parse(raw).map_err(|e| format!("not an absolute URL ({e})"))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err("must be an http or https URL".to_owned());
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err("must not carry credentials".to_owned());
        }
        let host = url.host_str().ok_or("must name a host")?.to_ascii_lowercase();
        let port = url.port_or_known_default().unwrap_or(0);
        if self.0.is_empty() {
            return Err("webhooks are not enabled: the service allows no webhook host (--webhook-allow-hosts)".into());
        }
        if self.0.iter().any(|pattern| pattern_allows(pattern, &host, port)) {
            Ok(url)
        } else {
            Err(format!("host {host}:{port} is not in --webhook-allow-hosts"))
        }
    }
}

fn pattern_allows(pattern: &str, host: &str, port: u16) -> bool {
    // A port is the part after the last colon outside IPv6 brackets.
    let (host_pattern, port_pattern) = match pattern.rsplit_once(':') {
        Some((h, p)) if !p.contains(']') && p.chars().all(|c| c.is_ascii_digit()) => (h, p.parse::<u16>().ok()),
        _ => (pattern, None),
    };
    if port_pattern.is_some_and(|p| p != port) {
        return false;
    }
    match host_pattern.strip_prefix("*.") {
        Some(domain) => {
            host.len() > domain.len() + 1 && host.ends_with(domain) && {
                let cut = host.len() - domain.len();
                host.as_bytes()[cut - 1] == b'.'
            }
        }
        None => host_pattern == host,
    }
}

/// A Standard Webhooks secret: `whsec_` and the base64 of the key.
#[derive(Clone)]
pub struct WebhookSecret(Vec<u8>);

impl std::fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WebhookSecret(…)")
    }
}

impl WebhookSecret {
    pub fn parse(secret: &str) -> Result<Self, String> {
        let encoded = secret
            .strip_prefix("whsec_")
            .ok_or("the webhook secret must start with whsec_")?;
        let key = STANDARD
            .decode(encoded)
            .map_err(|_| "the webhook secret after whsec_ must be base64".to_owned())?;
        if key.is_empty() {
            return Err("the webhook secret is empty".to_owned());
        }
        Ok(Self(key))
    }

    /// `v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`.
    pub fn sign(&self, id: &str, timestamp: i64, body: &str) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes a key of any length");
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body.as_bytes());
        format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
    }
}

/// The delays between attempts (`--webhook-retry-schedule-ms`).
#[derive(Debug, Clone)]
pub struct RetrySchedule(Vec<Duration>);

impl Default for RetrySchedule {
    fn default() -> Self {
        Self(
            DEFAULT_RETRY_SCHEDULE_MS
                .iter()
                .map(|ms| Duration::from_millis(*ms))
                .collect(),
        )
    }
}

impl RetrySchedule {
    /// Comma-separated milliseconds, e.g. `5000,300000`.
    pub fn parse(list: &str) -> Result<Self, String> {
        list.split(',')
            .map(|ms| {
                ms.trim()
                    .parse::<u64>()
                    .map(Duration::from_millis)
                    .map_err(|_| format!("{ms:?} is not a number of milliseconds"))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Self)
    }

    /// The delay before the next attempt after `failures` failed ones in a
    /// row; `None`: give up.
    pub fn after(&self, failures: u32) -> Option<Duration> {
        let index = usize::try_from(failures).ok()?.checked_sub(1)?;
        self.0.get(index).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_match_exactly_by_port_or_by_subdomain() {
        let allow = AllowHosts::parse("hooks.example.com, 127.0.0.1:9000 ,*.corp.test,[::1]:81");
        assert!(allow.check("https://hooks.example.com/x").is_ok());
        assert!(allow.check("http://HOOKS.example.com:8080/x").is_ok());
        assert!(allow.check("http://127.0.0.1:9000/").is_ok());
        assert!(allow.check("http://127.0.0.1:9001/").is_err());
        assert!(allow.check("https://a.b.corp.test/").is_ok());
        assert!(allow.check("https://corp.test/").is_err());
        assert!(allow.check("https://evilcorp.test/").is_err());
        assert!(allow.check("http://[::1]:81/").is_ok());
        assert!(allow.check("ftp://hooks.example.com/").is_err());
        assert!(allow.check("https://u:p@hooks.example.com/").is_err());
        assert!(allow.check("/relative").is_err());
        assert!(allow.check("https://hooks.example.com.evil.test/").is_err());
        assert!(AllowHosts::parse("").check("https://hooks.example.com/").is_err());
    }

    #[test]
    fn signature_is_the_standard_webhooks_one() {
        // The example of the Standard Webhooks specification.
        let secret = WebhookSecret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let body = r#"{"test": 2432232314}"#;
        assert_eq!(
            secret.sign("msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
        assert!(WebhookSecret::parse("MfKQ9r8G").is_err());
        assert!(WebhookSecret::parse("whsec_!!").is_err());
    }

    #[test]
    fn retries_follow_the_schedule_then_give_up() {
        let schedule = RetrySchedule::default();
        assert_eq!(schedule.after(1), Some(Duration::from_secs(5)));
        assert_eq!(schedule.after(7), Some(Duration::from_secs(36_000)));
        assert_eq!(schedule.after(8), None);
        assert_eq!(schedule.after(0), None);
        assert_eq!(
            RetrySchedule::parse("10, 20").unwrap().after(2),
            Some(Duration::from_millis(20))
        );
        assert!(RetrySchedule::parse("10,x").is_err());
    }
}
