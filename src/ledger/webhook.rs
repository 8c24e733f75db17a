//! Completion webhooks, the pure rules: the Standard Webhooks signature,
//! keyed per queue, and the retry schedule (where a webhook may go is
//! `allow_hosts`).

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The retry delays after each failed attempt: about 5 s, 5 min, 30 min, 2 h,
/// 5 h, 10 h, 10 h; after the last, the event is given up (`failed`).
pub const DEFAULT_RETRY_SCHEDULE_MS: [u64; 7] =
    [5_000, 300_000, 1_800_000, 7_200_000, 18_000_000, 36_000_000, 36_000_000];

pub use super::allow_hosts::AllowHosts;

/// A Standard Webhooks secret: `whsec_` and the base64 of the key.
#[derive(Clone)]
pub struct WebhookSecret(Vec<u8>);

/// The HKDF salt of the per-queue secrets: names what they are for, and
/// their version.
const QUEUE_SECRET_SALT: &[u8] = b"child-ledger/webhook-queue-secret/v1";

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

    /// The secret that signs `queue`'s events: HKDF-SHA256 (RFC 5869) of
    /// this (master) key, salt `child-ledger/webhook-queue-secret/v1`, info
    /// the queue name, 32 bytes. A receiver holds only its queues' secrets,
    /// so an event that verifies with one is an event of that queue.
    pub fn for_queue(&self, queue: &str) -> Self {
        Self(hkdf_sha256(QUEUE_SECRET_SALT, &self.0, queue.as_bytes()).to_vec())
    }

    /// `whsec_` and the base64 of the key, as `parse` reads it.
    pub fn to_whsec(&self) -> String {
        format!("whsec_{}", STANDARD.encode(&self.0))
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

/// HKDF-SHA256 (RFC 5869) with an output of one block (32 bytes):
/// `PRK = HMAC(salt, ikm)`, `OKM = HMAC(PRK, info || 0x01)`.
fn hkdf_sha256(salt: &[u8], ikm: &[u8], info: &[u8]) -> [u8; 32] {
    let mut extract = Hmac::<Sha256>::new_from_slice(salt).expect("HMAC takes a key of any length");
    extract.update(ikm);
    let pseudorandom = extract.finalize().into_bytes();
    let mut expand = Hmac::<Sha256>::new_from_slice(&pseudorandom).expect("HMAC takes a key of any length");
    expand.update(info);
    expand.update(&[1]);
    expand.finalize().into_bytes().into()
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
    fn signature_is_the_standard_webhooks_one() {
        // The example of the Standard Webhooks specification.
        let secret = WebhookSecret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let body = r#"{"test": 2432232314}"#;
        assert_eq!(
            secret.sign("msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
        assert!(WebhookSecret::parse("MfKQ9r8G").is_err());
        assert_eq!(WebhookSecret::parse(&secret.to_whsec()).unwrap().0, secret.0);
        assert!(WebhookSecret::parse("whsec_!!").is_err());
    }

    #[test]
    fn each_queue_has_its_own_secret() {
        let master = WebhookSecret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let a = master.for_queue("a");
        assert_ne!(a.0, master.0);
        assert_ne!(a.0, master.for_queue("b").0);
        assert_eq!(a.0, master.for_queue("a").0, "derived, not random");
        assert_eq!(a.0.len(), 32);
        assert_ne!(a.sign("msg_1", 1, "{}"), master.for_queue("b").sign("msg_1", 1, "{}"));
        // RFC 5869, test case 1 (the first 32 bytes of its 42-byte OKM).
        let salt: Vec<u8> = (0u8..=0x0c).collect();
        let info: Vec<u8> = (0xf0u8..=0xf9).collect();
        assert_eq!(
            hex::encode(hkdf_sha256(&salt, &[0x0b; 22], &info)),
            "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf"
        );
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
