//! Bounds on the message-id and time columns taken from a query's filters, so the live-tail
//! reader skips partitions, ledgers and entries before decoding them.
//!
//! Only conjuncts of the form `column <op> literal` (and BETWEEN, IN of literals for
//! `partition`) on `ledger_id`, `entry_id`, `partition` and `publish_time` give bounds; any
//! other filter gives none. Bounds only ever skip rows the filters would drop: the filters are
//! still evaluated on every decoded row.

use datafusion::common::ScalarValue;
use datafusion::logical_expr::{Between, BinaryExpr, Expr, Operator};

/// Inclusive bounds; `None` means unbounded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bounds {
    /// `ledger_id` range.
    pub ledger: (Option<i64>, Option<i64>),
    /// `entry_id` range.
    pub entry: (Option<i64>, Option<i64>),
    /// `publish_time` range (µs since the epoch).
    pub publish_us: (Option<i64>, Option<i64>),
    /// Allowed `partition` values (`None`: all).
    pub partitions: Option<Vec<i32>>,
}

impl Bounds {
    /// Bounds implied by the conjunction of `filters`.
    pub fn from_filters(filters: &[Expr]) -> Bounds {
        let mut b = Bounds::default();
        for f in filters {
            b.add(f);
        }
        b
    }

    fn add(&mut self, e: &Expr) {
        match e {
            Expr::BinaryExpr(BinaryExpr { left, op, right }) if *op == Operator::And => {
                self.add(left);
                self.add(right);
            }
            Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
                if let (Some(col), Some(v)) = (column(left), literal(right)) {
                    self.compare(&col, *op, v);
                } else if let (Some(v), Some(col)) = (literal(left), column(right)) {
                    if let Some(op) = op.swap() {
                        self.compare(&col, op, v);
                    }
                }
            }
            Expr::Between(Between {
                expr,
                negated: false,
                low,
                high,
            }) => {
                if let (Some(col), Some(lo), Some(hi)) = (column(expr), literal(low), literal(high))
                {
                    self.compare(&col, Operator::GtEq, lo);
                    self.compare(&col, Operator::LtEq, hi);
                }
            }
            Expr::InList(list)
                if !list.negated && column(&list.expr).as_deref() == Some("partition") =>
            {
                let values: Option<Vec<i32>> = list
                    .list
                    .iter()
                    .map(|v| literal(v).and_then(|x| i32::try_from(x).ok()))
                    .collect();
                if let Some(values) = values {
                    self.restrict_partitions(values);
                }
            }
            _ => {}
        }
    }

    fn restrict_partitions(&mut self, values: Vec<i32>) {
        self.partitions = Some(match self.partitions.take() {
            None => values,
            Some(old) => old.into_iter().filter(|p| values.contains(p)).collect(),
        });
    }

    fn compare(&mut self, col: &str, op: Operator, v: i64) {
        let range = match col {
            "ledger_id" => &mut self.ledger,
            "entry_id" => &mut self.entry,
            "publish_time" => &mut self.publish_us,
            "partition" => {
                if op == Operator::Eq {
                    if let Ok(p) = i32::try_from(v) {
                        self.restrict_partitions(vec![p]);
                    }
                }
                return;
            }
            _ => return,
        };
        let (lo, hi) = match op {
            Operator::Eq => (Some(v), Some(v)),
            Operator::Gt => (v.checked_add(1), None),
            Operator::GtEq => (Some(v), None),
            Operator::Lt => (None, v.checked_sub(1)),
            Operator::LtEq => (None, Some(v)),
            _ => (None, None),
        };
        if let Some(lo) = lo {
            range.0 = Some(range.0.map_or(lo, |x| x.max(lo)));
        }
        if let Some(hi) = hi {
            range.1 = Some(range.1.map_or(hi, |x| x.min(hi)));
        }
    }

    /// Whether rows of `partition` may match.
    pub fn partition_may_match(&self, partition: i32) -> bool {
        self.partitions
            .as_ref()
            .is_none_or(|ps| ps.contains(&partition))
    }

    /// Whether rows of `ledger`, published between `min_ms` and `max_ms` (if known), may match.
    pub fn ledger_may_match(&self, ledger: i64, min_ms: Option<i64>, max_ms: Option<i64>) -> bool {
        let in_ids = self.ledger.0.is_none_or(|lo| ledger >= lo)
            && self.ledger.1.is_none_or(|hi| ledger <= hi);
        // Publish times are stored in ms; a row at ms `t` has µs in [t*1000, t*1000+999].
        let in_time = match (min_ms, max_ms) {
            (Some(min), Some(max)) => {
                self.publish_us
                    .1
                    .is_none_or(|hi| min.saturating_mul(1000) <= hi)
                    && self
                        .publish_us
                        .0
                        .is_none_or(|lo| max.saturating_mul(1000).saturating_add(999) >= lo)
            }
            _ => true,
        };
        in_ids && in_time
    }

    /// The entry ids `first..=last` of a ledger with `count` entries that may match, or `None`.
    pub fn entry_span(&self, count: u64) -> Option<(u64, u64)> {
        if count == 0 {
            return None;
        }
        let first = self.entry.0.map_or(0, |lo| lo.max(0) as u64);
        let last = self.entry.1.map_or(count - 1, |hi| {
            if hi < 0 {
                0
            } else {
                (hi as u64).min(count - 1)
            }
        });
        if self.entry.1.is_some_and(|hi| hi < 0) || first > last {
            None
        } else {
            Some((first, last))
        }
    }

    /// Text for EXPLAIN.
    pub fn describe(&self) -> String {
        fn range(name: &str, r: &(Option<i64>, Option<i64>)) -> Option<String> {
            match r {
                (None, None) => None,
                (lo, hi) => Some(format!(
                    "{name}=[{}..{}]",
                    lo.map_or("".into(), |v| v.to_string()),
                    hi.map_or("".into(), |v| v.to_string())
                )),
            }
        }
        let mut parts: Vec<String> = [
            range("ledger_id", &self.ledger),
            range("entry_id", &self.entry),
            range("publish_time_us", &self.publish_us),
        ]
        .into_iter()
        .flatten()
        .collect();
        if let Some(ps) = &self.partitions {
            parts.push(format!("partition in {ps:?}"));
        }
        parts.join(", ")
    }
}

fn column(e: &Expr) -> Option<String> {
    match e {
        Expr::Column(c) => Some(c.name.clone()),
        Expr::Cast(c) => column(&c.expr),
        Expr::TryCast(c) => column(&c.expr),
        _ => None,
    }
}

/// An integer or timestamp literal as i64 (timestamps in µs).
fn literal(e: &Expr) -> Option<i64> {
    let Expr::Literal(v, _) = e else {
        return None;
    };
    match v {
        ScalarValue::Int8(Some(x)) => Some(i64::from(*x)),
        ScalarValue::Int16(Some(x)) => Some(i64::from(*x)),
        ScalarValue::Int32(Some(x)) => Some(i64::from(*x)),
        ScalarValue::Int64(Some(x)) => Some(*x),
        ScalarValue::UInt8(Some(x)) => Some(i64::from(*x)),
        ScalarValue::UInt16(Some(x)) => Some(i64::from(*x)),
        ScalarValue::UInt32(Some(x)) => Some(i64::from(*x)),
        ScalarValue::UInt64(Some(x)) => i64::try_from(*x).ok(),
        ScalarValue::TimestampSecond(Some(x), _) => x.checked_mul(1_000_000),
        ScalarValue::TimestampMillisecond(Some(x), _) => x.checked_mul(1000),
        ScalarValue::TimestampMicrosecond(Some(x), _) => Some(*x),
        ScalarValue::TimestampNanosecond(Some(x), _) => Some(x.div_euclid(1000)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::prelude::{col, lit};

    #[test]
    fn conjuncts_narrow_the_bounds() {
        let b = Bounds::from_filters(&[
            col("ledger_id").gt_eq(lit(5i64)),
            col("ledger_id").lt(lit(9i64)),
            lit(3i64).lt(col("entry_id")),
            col("partition").eq(lit(2i32)),
            col("key").eq(lit("k")),
        ]);
        assert_eq!(b.ledger, (Some(5), Some(8)));
        assert_eq!(b.entry, (Some(4), None));
        assert_eq!(b.partitions, Some(vec![2]));
        assert!(b.ledger_may_match(5, None, None));
        assert!(!b.ledger_may_match(9, None, None));
        assert!(!b.partition_may_match(1));
        assert_eq!(b.entry_span(10), Some((4, 9)));
        assert_eq!(b.entry_span(3), None);
    }

    #[test]
    fn time_bounds_prune_ledgers_by_their_publish_range() {
        let t = ScalarValue::TimestampMicrosecond(Some(2_000_000), Some("+00:00".into()));
        let b = Bounds::from_filters(&[col("publish_time").gt_eq(Expr::Literal(t, None))]);
        assert_eq!(b.publish_us, (Some(2_000_000), None));
        assert!(!b.ledger_may_match(1, Some(0), Some(1_999)));
        assert!(b.ledger_may_match(1, Some(0), Some(2_000)));
        assert!(b.ledger_may_match(1, None, None));
    }

    #[test]
    fn other_filters_give_no_bounds() {
        let b = Bounds::from_filters(&[col("ledger_id").not_eq(lit(1i64)), col("key").is_null()]);
        assert_eq!(b, Bounds::default());
    }
}
