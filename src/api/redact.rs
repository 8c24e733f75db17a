//! What a caller is shown of a `webhook_url`: its query string may carry a
//! receiver's secret (a token the receiver checks), so only an admin sees
//! it; every other caller sees it replaced by `redacted`.

use super::guard::Caller;
use crate::access::Role;
use crate::ledger::Parent;
use crate::ledger::allow_hosts::redact_url;
use crate::store::Delivery;

impl Caller {
    pub(crate) fn sees_webhook_secrets(&self) -> bool {
        self.0.may(Role::Admin)
    }

    /// `parent` as this caller may see it.
    pub fn shown(&self, mut parent: Parent) -> Parent {
        if !self.sees_webhook_secrets() {
            parent.webhook_url = parent.webhook_url.as_deref().map(redact_url);
        }
        parent
    }

    /// `deliveries` as this caller may see them.
    pub fn shown_deliveries(&self, mut deliveries: Vec<Delivery>) -> Vec<Delivery> {
        if !self.sees_webhook_secrets() {
            for delivery in &mut deliveries {
                delivery.url = redact_url(&delivery.url);
            }
        }
        deliveries
    }
}
