//! The load manager: moves topics off a node well above the cluster's mean load, hot
//! partitions first (DS-FAIL-12), by planned moves (nothing is copied).
//!
//! Decentralised, as nothing here needs consensus: every `broker.load_balancer.interval` each
//! node publishes its message rate ([`crate::cluster::load`]) and reads everyone's; a node
//! above the mean × (1 + `overload_threshold`) (and above `min_rate`) moves one of its own
//! topics to the least-loaded node. The topic chosen is the first, hot ones before the others
//! and each group by rate, whose move narrows the gap between the two nodes (its rate is below
//! the gap), so two nodes never trade a topic back and forth.
//!
//! Invariant: a node moves only topics it serves, at most one per interval, and never to a
//! node that is stopping or whose report is missing.

use std::sync::Arc;

use super::Broker;
use crate::cluster::load::{LoadBoard, LoadReport};
use crate::config::LoadBalancerConfig;
use crate::naming::TopicName;

/// One topic as the load manager weighs it.
#[derive(Debug, Clone)]
pub(crate) struct TopicLoad {
    pub name: TopicName,
    /// Messages per second in and out.
    pub rate: f64,
    /// Flagged hot (its share of its topic's in-rate is well above an even share).
    pub hot: bool,
}

/// The move an overloaded node `me` should make now, if any: (topic, target node id).
pub(crate) fn plan_move(
    me: &str,
    reports: &[LoadReport],
    topics: &[TopicLoad],
    cfg: &LoadBalancerConfig,
) -> Option<(TopicName, String)> {
    if reports.len() < 2 {
        return None;
    }
    let mine = reports.iter().find(|r| r.node == me)?.msg_rate;
    let mean = reports.iter().map(|r| r.msg_rate).sum::<f64>() / reports.len() as f64;
    if mine < cfg.min_rate || mine <= mean * (1.0 + cfg.overload_threshold) {
        return None;
    }
    let target = reports
        .iter()
        .filter(|r| r.node != me)
        .min_by(|a, b| a.msg_rate.total_cmp(&b.msg_rate))?;
    let gap = mine - target.msg_rate;
    let mut order: Vec<&TopicLoad> = topics.iter().collect();
    order.sort_by(|a, b| b.hot.cmp(&a.hot).then(b.rate.total_cmp(&a.rate)));
    order
        .into_iter()
        .find(|t| t.rate > 0.0 && t.rate < gap)
        .map(|t| (t.name.clone(), target.node.clone()))
}

impl Broker {
    /// Starts the load manager (unless its interval is zero).
    pub(crate) fn spawn_load_manager(self: &Arc<Self>, board: LoadBoard) {
        let cfg = self.config.load_balancer.clone();
        if cfg.interval.is_zero() {
            return;
        }
        let broker = self.clone();
        self.tasks.spawn(async move {
            let mut tick = tokio::time::interval(cfg.interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tokio::select! {
                    _ = broker.stop.cancelled() => return,
                    _ = tick.tick() => {}
                }
                broker.balance_once(&board, &cfg).await;
            }
        });
    }

    /// One round: report this node's load; if it is overloaded, move one topic away.
    async fn balance_once(self: &Arc<Self>, board: &LoadBoard, cfg: &LoadBalancerConfig) {
        let topics: Vec<TopicLoad> = self
            .loaded_topics()
            .iter()
            .map(|t| {
                let row = super::measure::topic_row(t);
                TopicLoad {
                    name: t.name.clone(),
                    rate: row.rate_in + row.rate_out,
                    hot: row.hot,
                }
            })
            .collect();
        let me = self.ownership.me().id.clone();
        let report = LoadReport {
            node: me.clone(),
            msg_rate: topics.iter().map(|t| t.rate).sum(),
            topics: topics.len() as u64,
            at_ms: crate::ledger::now_ms(),
        };
        if let Err(e) = board.publish(&report).await {
            tracing::warn!(error = %e, "publishing this node's load failed");
            return;
        }
        let reports = match board.reports().await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "reading the nodes' loads failed");
                return;
            }
        };
        let Some((topic, target)) = plan_move(&me, &reports, &topics, cfg) else {
            return;
        };
        tracing::info!(%topic, %target, load = report.msg_rate,
            "load manager: moving a topic off this overloaded node");
        if let Err(e) = self.unload_to(&topic, Some(&target)).await {
            tracing::warn!(%topic, %target, error = %e, "load manager: the move failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(node: &str, rate: f64) -> LoadReport {
        LoadReport {
            node: node.into(),
            msg_rate: rate,
            topics: 1,
            at_ms: 0,
        }
    }

    fn topic(name: &str, rate: f64, hot: bool) -> TopicLoad {
        TopicLoad {
            name: format!("persistent://t/n/{name}")
                .parse()
                .expect("a valid name"),
            rate,
            hot,
        }
    }

    #[test]
    fn an_overloaded_node_moves_a_hot_topic_that_narrows_the_gap() {
        let cfg = LoadBalancerConfig::default();
        let reports = [report("a", 1000.0), report("b", 100.0), report("c", 400.0)];
        let topics = [
            topic("big", 600.0, false),
            topic("warm", 300.0, false),
            topic("hot", 100.0, true),
        ];
        // Hot first; 100 < gap 900.
        let (t, to) = plan_move("a", &reports, &topics, &cfg).expect("a move");
        assert_eq!(
            (t.to_string().as_str(), to.as_str()),
            ("persistent://t/n/hot", "b")
        );
        // Without hot topics, the largest one that narrows the gap (600 < 900).
        let cold = [topic("big", 600.0, false), topic("warm", 300.0, false)];
        let (t, _) = plan_move("a", &reports, &cold, &cfg).expect("a move");
        assert!(t.to_string().ends_with("/big"));
        // A topic as large as the gap would only swap the imbalance: never moved.
        let one = [topic("all", 900.0, false)];
        assert!(plan_move("a", &reports, &one, &cfg).is_none());
    }

    #[test]
    fn balanced_idle_or_lonely_nodes_move_nothing() {
        let cfg = LoadBalancerConfig::default();
        let topics = [topic("x", 10.0, true)];
        // Within the threshold of the mean.
        let even = [report("a", 120.0), report("b", 100.0)];
        assert!(plan_move("a", &even, &topics, &cfg).is_none());
        // Below the minimum rate.
        let idle = [report("a", 50.0), report("b", 0.0)];
        assert!(plan_move("a", &idle, &topics, &cfg).is_none());
        // One node, or this node unreported.
        assert!(plan_move("a", &[report("a", 1000.0)], &topics, &cfg).is_none());
        assert!(plan_move("z", &even, &topics, &cfg).is_none());
    }
}
