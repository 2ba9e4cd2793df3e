//! `count(DISTINCT x)` over nested values (a tuple such as `(ledger_id, entry_id,
//! batch_index)`, a struct or a list) without exhausting the query's memory.
//!
//! DataFusion counts such values with a generic accumulator that keeps one `ScalarValue` per
//! distinct value, each a one-row slice that shares (and is accounted as) its whole source
//! batch: 20,000 rows asked the pool for 12 GB. The optimizer rule [`DistinctNestedKeys`]
//! rewrites the argument of every `count(DISTINCT <nested>)` to `distinct_key(<nested>)`: the
//! value in arrow's row format (a byte string, equal exactly when the values are equal, null
//! when the value is null), which DataFusion counts with its compact byte-string accumulator.
//! The aggregate keeps its name, so the plan's schema does not change.
//!
//! Invariants:
//! - The rewrite applies only to types the row format encodes by value (nested types without
//!   dictionaries); everything else is left to DataFusion. Arrow's row format does not encode
//!   maps, so a map is keyed as the list of its entries (key, value) in their stored order, the
//!   order in which a message's properties are written.
//! - The rule runs before DataFusion's own rules, so a lone `count(DISTINCT <map>)`, which
//!   DataFusion would turn into a GROUP BY of the map (unsupported), groups by the key instead.
//! - `distinct_key` is injective on values and keeps nulls null, so the count is unchanged.

use std::any::Any;
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, LargeBinaryBuilder, ListArray, StructArray,
};
use datafusion::arrow::datatypes::{DataType, Field, FieldRef};
use datafusion::arrow::row::{RowConverter, SortField};
use datafusion::common::tree_node::Transformed;
use datafusion::common::{DFSchema, Result as DfResult};
use datafusion::logical_expr::expr::AggregateFunction;
use datafusion::logical_expr::{
    Aggregate, ColumnarValue, Expr, ExprSchemable, LogicalPlan, ScalarFunctionArgs, ScalarUDF,
    ScalarUDFImpl, Signature, Volatility,
};
use datafusion::optimizer::optimizer::ApplyOrder;
use datafusion::optimizer::{OptimizerConfig, OptimizerRule};

/// Rewrites `count(DISTINCT <nested>)` to count row-format keys (see the module docs).
#[derive(Debug, Default)]
pub struct DistinctNestedKeys;

/// Whether `count(DISTINCT)` over `dt` should count row-format keys instead.
fn wants_key(dt: &DataType) -> bool {
    fn has_dictionary(dt: &DataType) -> bool {
        match dt {
            DataType::Dictionary(..) => true,
            DataType::Struct(fields) => fields.iter().any(|f| has_dictionary(f.data_type())),
            DataType::List(f)
            | DataType::LargeList(f)
            | DataType::FixedSizeList(f, _)
            | DataType::ListView(f)
            | DataType::LargeListView(f)
            | DataType::Map(f, _) => has_dictionary(f.data_type()),
            _ => false,
        }
    }
    let nested = matches!(
        dt,
        DataType::Struct(_)
            | DataType::List(_)
            | DataType::LargeList(_)
            | DataType::FixedSizeList(..)
            | DataType::Map(..)
    );
    nested
        && !has_dictionary(dt)
        && RowConverter::supports_fields(&[SortField::new(without_maps(dt))])
}

/// `dt` with every map replaced by the list of its entries.
fn without_maps(dt: &DataType) -> DataType {
    let field = |f: &FieldRef| -> FieldRef {
        Arc::new(Field::new(
            f.name(),
            without_maps(f.data_type()),
            f.is_nullable(),
        ))
    };
    match dt {
        DataType::Map(entries, _) => DataType::List(field(entries)),
        DataType::Struct(fields) => DataType::Struct(fields.iter().map(field).collect()),
        DataType::List(f) => DataType::List(field(f)),
        // Large and fixed-size lists of maps stay as they are (the row format refuses them).
        other => other.clone(),
    }
}

/// `values` with every map replaced by the list of its entries (same offsets, same entries).
fn maps_as_lists(values: &ArrayRef) -> DfResult<ArrayRef> {
    Ok(match values.data_type() {
        DataType::Map(..) => {
            let map = values.as_map();
            let entries: ArrayRef = Arc::new(map.entries().clone());
            let entries = maps_as_lists(&entries)?;
            let DataType::List(item) = without_maps(values.data_type()) else {
                return datafusion::common::internal_err!("a map's entries are not a list");
            };
            Arc::new(ListArray::try_new(
                item,
                map.offsets().clone(),
                entries,
                map.nulls().cloned(),
            )?)
        }
        DataType::Struct(_) => {
            let s = values.as_struct();
            let columns = s
                .columns()
                .iter()
                .map(maps_as_lists)
                .collect::<DfResult<Vec<_>>>()?;
            let DataType::Struct(fields) = without_maps(values.data_type()) else {
                return datafusion::common::internal_err!("a struct is not a struct");
            };
            Arc::new(StructArray::try_new(fields, columns, s.nulls().cloned())?)
        }
        DataType::List(_) => {
            let l = values.as_list::<i32>();
            let DataType::List(item) = without_maps(values.data_type()) else {
                return datafusion::common::internal_err!("a list is not a list");
            };
            Arc::new(ListArray::try_new(
                item,
                l.offsets().clone(),
                maps_as_lists(l.values())?,
                l.nulls().cloned(),
            )?)
        }
        _ => values.clone(),
    })
}

impl DistinctNestedKeys {
    /// `e` with its distinct count over a nested value counting keys, if it is one.
    fn rewrite_expr(e: &Expr, input: &DFSchema) -> DfResult<Option<Expr>> {
        let (inner, name) = match e {
            Expr::Alias(a) => (a.expr.as_ref(), a.name.clone()),
            other => (other, other.schema_name().to_string()),
        };
        let Expr::AggregateFunction(AggregateFunction { func, params }) = inner else {
            return Ok(None);
        };
        if !params.distinct || func.name() != "count" || params.args.len() != 1 {
            return Ok(None);
        }
        let arg = &params.args[0];
        if !wants_key(&arg.get_type(input)?) {
            return Ok(None);
        }
        let mut params = params.clone();
        params.args = vec![distinct_key_udf().call(vec![arg.clone()])];
        let counted = Expr::AggregateFunction(AggregateFunction {
            func: func.clone(),
            params,
        });
        Ok(Some(counted.alias(name)))
    }
}

impl OptimizerRule for DistinctNestedKeys {
    fn name(&self) -> &str {
        "ledgerlake_distinct_nested_keys"
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        Some(ApplyOrder::BottomUp)
    }

    fn supports_rewrite(&self) -> bool {
        true
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        _config: &dyn OptimizerConfig,
    ) -> DfResult<Transformed<LogicalPlan>> {
        let LogicalPlan::Aggregate(agg) = plan else {
            return Ok(Transformed::no(plan));
        };
        let mut changed = false;
        let mut exprs = Vec::with_capacity(agg.aggr_expr.len());
        for e in &agg.aggr_expr {
            match Self::rewrite_expr(e, agg.input.schema())? {
                Some(new) => {
                    changed = true;
                    exprs.push(new);
                }
                None => exprs.push(e.clone()),
            }
        }
        if !changed {
            return Ok(Transformed::no(LogicalPlan::Aggregate(agg)));
        }
        let rewritten = Aggregate::try_new(agg.input.clone(), agg.group_expr.clone(), exprs)?;
        Ok(Transformed::yes(LogicalPlan::Aggregate(rewritten)))
    }
}

/// The `distinct_key` function.
pub fn distinct_key_udf() -> ScalarUDF {
    ScalarUDF::from(DistinctKey {
        signature: Signature::any(1, Volatility::Immutable),
    })
}

/// A value in arrow's row format: equal bytes exactly for equal values; null stays null.
#[derive(Debug, PartialEq, Eq, Hash)]
struct DistinctKey {
    signature: Signature,
}

impl ScalarUDFImpl for DistinctKey {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn name(&self) -> &str {
        "distinct_key"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _args: &[DataType]) -> DfResult<DataType> {
        Ok(DataType::LargeBinary)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let arrays = ColumnarValue::values_to_arrays(&args.args)?;
        let Some(values) = arrays.first() else {
            return datafusion::common::plan_err!("distinct_key takes one argument");
        };
        Ok(ColumnarValue::Array(row_keys(values)?))
    }
}

/// The row-format key of each value of `values` (null where the value is null).
fn row_keys(values: &ArrayRef) -> DfResult<ArrayRef> {
    let values = &maps_as_lists(values)?;
    let converter = RowConverter::new(vec![SortField::new(values.data_type().clone())])?;
    let rows = converter.convert_columns(std::slice::from_ref(values))?;
    // 64-bit offsets: one batch's keys may exceed 2 GiB.
    let mut out = LargeBinaryBuilder::with_capacity(values.len(), rows.size());
    for i in 0..values.len() {
        if values.is_valid(i) {
            out.append_value(rows.row(i).as_ref());
        } else {
            out.append_null();
        }
    }
    Ok(Arc::new(out.finish()))
}

#[cfg(test)]
mod tests;
