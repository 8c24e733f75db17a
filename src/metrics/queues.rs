//! The per-queue series: the gauges every scrape reads from the store, and
//! what a token limited to some queues is shown of them.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::{FlowKeyLabels, Metrics, QueueGauge, QueueLabel, StateLabel, lock};

impl Metrics {
    /// What a token limited to some queues is shown: only the series of the
    /// queues it `reaches` (children claimed, and the per-queue gauges of
    /// `queues`, which the caller has already limited to them). Process-wide
    /// series add up every tenant's work (requests, outcomes, pools, ...),
    /// so they are left out.
    pub fn render_queues(&self, queues: &[QueueGauge], reaches: &dyn Fn(&str) -> bool) -> String {
        self.known_queues(queues);
        let mut scrape = Registry::default();
        let claimed = Family::<QueueLabel, Counter>::default();
        let seen: Vec<String> = lock(&self.claimed_queues).iter().cloned().collect();
        for queue in seen.into_iter().filter(|q| reaches(q)) {
            let label = QueueLabel { queue };
            if let Some(counter) = self.claimed.get(&label) {
                claimed.get_or_create(&label).inc_by(counter.get());
            }
        }
        scrape.register(
            "child_ledger_children_claimed",
            "Children handed out by claims, by the queue of their parent",
            claimed,
        );
        let reached: Vec<QueueGauge> = queues.iter().filter(|q| reaches(&q.queue)).cloned().collect();
        self.register_queue_gauges(&mut scrape, &reached);
        let mut out = String::with_capacity(1024);
        prometheus_text::encode(&mut out, &scrape).expect("metrics encode as text");
        out
    }

    /// The per-queue gauges of the first `max_queues` of `queues` by name.
    pub(super) fn register_queue_gauges(&self, scrape: &mut Registry, queues: &[QueueGauge]) {
        let mut shown: Vec<&QueueGauge> = queues.iter().collect();
        shown.sort_by(|a, b| a.queue.cmp(&b.queue));
        shown.truncate(self.max_queues);
        let children = Family::<(QueueLabel, StateLabel), Gauge>::default();
        let oldest = Family::<QueueLabel, Gauge<f64, AtomicU64>>::default();
        let keys = Family::<FlowKeyLabels, Gauge>::default();
        for gauge in shown {
            for (flow_key, n) in &gauge.flow_keys {
                let labels = FlowKeyLabels {
                    queue: gauge.queue.clone(),
                    flow_key: flow_key.clone(),
                };
                keys.get_or_create(&labels).set(*n);
            }
            let label = QueueLabel {
                queue: gauge.queue.clone(),
            };
            for (state, n) in [
                ("pending", gauge.pending),
                ("in_flight", gauge.in_flight),
                ("held", gauge.held),
            ] {
                children.get_or_create(&(label.clone(), StateLabel { state })).set(n);
            }
            if let Some(age) = gauge.oldest_pending_age_seconds {
                oldest.get_or_create(&label).set(age);
            }
        }
        scrape.register(
            "child_ledger_queue_children",
            "Children of each queue not yet terminal, by state (pending, in_flight, held), as the store counts them",
            children,
        );
        scrape.register(
            "child_ledger_queue_oldest_pending_age_seconds",
            "How long the oldest pending child of each queue has waited; absent while none is pending",
            oldest,
        );
        scrape.register(
            "child_ledger_flow_key_in_flight",
            "Children with a live lease per flow key of each queue (its 20 busiest keys), what per-key limits count",
            keys,
        );
    }
}
