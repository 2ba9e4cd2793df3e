//! Functions whose DataFusion 53 behaviour differs from what every other SQL engine answers,
//! replaced in each session by a version that answers as they do.
//!
//! - `median(<integer>)`: DataFusion 53 returns the integer type, so the median of 1 and 2 is 1
//!   (apache/datafusion#19536, changed in later releases). PostgreSQL's `percentile_cont(0.5)`,
//!   DuckDB and Spark return the average of the two middle values as a double. Here integer
//!   arguments are coerced to `double` before DataFusion's own median runs (its accumulators,
//!   grouped and not, are used unchanged).
//!
//! - `json_get_int` and `json_get_float` (datafusion-functions-json 0.53.1) answer NULL for every
//!   negative number (a leading minus is taken for "not a number"), and `json_get_int` for
//!   integers past 2^53's digits. Ours parse the document with serde_json and answer the number
//!   at the path (keys and array indexes), NULL when the path is missing or the value is not a
//!   number of that kind, as theirs do otherwise. A function rewrite registered after theirs
//!   replaces the calls their own rewrites build (`json_get(x, 'a')::int`).
//!
//! Invariant: a replacement keeps the name, arity and every other behaviour of the function it
//! replaces.

use std::any::Any;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Float64Builder, Int64Builder};
use arrow::compute::{cast_with_options, CastOptions};
use arrow::datatypes::{DataType, FieldRef};
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::Transformed;
use datafusion::common::{DFSchema, Result as DFResult};
use datafusion::execution::FunctionRegistry;
use datafusion::functions_aggregate::median::Median;
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::expr_rewriter::FunctionRewrite;
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, ColumnarValue, Expr, GroupsAccumulator,
    ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use datafusion::prelude::SessionContext;
use serde_json::Value;

/// Registers the replacements in `ctx` (after datafusion-functions-json's own functions).
pub(crate) fn register(ctx: &mut SessionContext) -> DFResult<()> {
    ctx.register_udaf(Arc::new(AggregateUDF::from(MedianAsDouble::default())))?;
    for kind in [JsonNumber::Int, JsonNumber::Float] {
        ctx.register_udf(kind.udf())?;
    }
    ctx.register_function_rewrite(Arc::new(JsonNumberCalls))?;
    Ok(())
}

/// Which number a JSON getter answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum JsonNumber {
    Int,
    Float,
}

impl JsonNumber {
    fn name(self) -> &'static str {
        match self {
            JsonNumber::Int => "json_get_int",
            JsonNumber::Float => "json_get_float",
        }
    }

    fn udf(self) -> Arc<ScalarUDF> {
        Arc::new(ScalarUDF::from(JsonGetNumber {
            kind: self,
            signature: Signature::variadic_any(Volatility::Immutable),
        }))
    }
}

/// `json_get_int(json, path...)` / `json_get_float(json, path...)`.
#[derive(Debug, PartialEq, Eq, Hash)]
struct JsonGetNumber {
    kind: JsonNumber,
    signature: Signature,
}

/// One step of a JSON path: an object key or an array index.
enum Step<'a> {
    Key(&'a str),
    Index(i64),
}

/// The value at `path` in `doc`.
fn at_path<'v>(doc: &'v Value, path: &[Step<'_>]) -> Option<&'v Value> {
    path.iter().try_fold(doc, |v, step| match step {
        Step::Key(k) => v.as_object()?.get(*k),
        Step::Index(i) => {
            let items = v.as_array()?;
            let i = if *i < 0 { items.len() as i64 + i } else { *i };
            items.get(usize::try_from(i).ok()?)
        }
    })
}

impl ScalarUDFImpl for JsonGetNumber {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn name(&self) -> &str {
        self.kind.name()
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> DFResult<DataType> {
        if args.is_empty() {
            return datafusion::common::plan_err!("{} takes a JSON value and a path", self.name());
        }
        Ok(match self.kind {
            JsonNumber::Int => DataType::Int64,
            JsonNumber::Float => DataType::Float64,
        })
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DFResult<ColumnarValue> {
        let rows = args.number_rows;
        let arrays = ColumnarValue::values_to_arrays(&args.args)?;
        let Some((json, path)) = arrays.split_first() else {
            return datafusion::common::plan_err!("{} takes a JSON value and a path", self.name());
        };
        let text = as_text(json, self.name())?;
        let text = text.as_string::<i32>();
        let mut ints = Int64Builder::with_capacity(rows);
        let mut floats = Float64Builder::with_capacity(rows);
        for row in 0..rows {
            let value = if text.is_null(row) {
                None
            } else {
                let steps = path_at(path, row)?;
                serde_json::from_str::<Value>(text.value(row))
                    .ok()
                    .and_then(|doc| steps.and_then(|s| at_path(&doc, &s).cloned()))
            };
            match self.kind {
                JsonNumber::Int => ints.append_option(value.as_ref().and_then(Value::as_i64)),
                JsonNumber::Float => floats.append_option(value.as_ref().and_then(Value::as_f64)),
            }
        }
        let out: ArrayRef = match self.kind {
            JsonNumber::Int => Arc::new(ints.finish()),
            JsonNumber::Float => Arc::new(floats.finish()),
        };
        Ok(ColumnarValue::Array(out))
    }
}

/// The JSON argument as text (strings of any kind, or UTF-8 bytes; invalid UTF-8 is null).
fn as_text(json: &ArrayRef, name: &str) -> DFResult<ArrayRef> {
    match json.data_type() {
        DataType::Utf8 => Ok(json.clone()),
        DataType::LargeUtf8
        | DataType::Utf8View
        | DataType::Binary
        | DataType::LargeBinary
        | DataType::BinaryView
        | DataType::Dictionary(..) => Ok(cast_with_options(
            json,
            &DataType::Utf8,
            &CastOptions {
                safe: true,
                ..Default::default()
            },
        )?),
        other => datafusion::common::plan_err!(
            "{name} reads JSON text, not {other} (for a json_get result, give the whole path: \
             {name}(x, 'a', 'b'))"
        ),
    }
}

/// The path of row `row` (`None` when a step is null).
fn path_at(path: &[ArrayRef], row: usize) -> DFResult<Option<Vec<Step<'_>>>> {
    let mut steps = Vec::with_capacity(path.len());
    for p in path {
        if p.is_null(row) {
            return Ok(None);
        }
        steps.push(match p.data_type() {
            DataType::Utf8 => Step::Key(p.as_string::<i32>().value(row)),
            DataType::LargeUtf8 => Step::Key(p.as_string::<i64>().value(row)),
            DataType::Utf8View => Step::Key(p.as_string_view().value(row)),
            DataType::Int64 => {
                Step::Index(p.as_primitive::<arrow::datatypes::Int64Type>().value(row))
            }
            DataType::Int32 => Step::Index(
                p.as_primitive::<arrow::datatypes::Int32Type>()
                    .value(row)
                    .into(),
            ),
            other => {
                return datafusion::common::plan_err!(
                    "a JSON path step is a string key or an integer index, not {other}"
                )
            }
        });
    }
    Ok(Some(steps))
}

/// Replaces calls to datafusion-functions-json's number getters, including those its own
/// rewrites build, with ours.
#[derive(Debug)]
struct JsonNumberCalls;

impl FunctionRewrite for JsonNumberCalls {
    fn name(&self) -> &'static str {
        "ledgerlake_json_numbers"
    }

    fn rewrite(
        &self,
        expr: Expr,
        _schema: &DFSchema,
        _config: &ConfigOptions,
    ) -> DFResult<Transformed<Expr>> {
        let Expr::ScalarFunction(f) = &expr else {
            return Ok(Transformed::no(expr));
        };
        let kind = match f.func.name() {
            "json_get_int" => JsonNumber::Int,
            "json_get_float" => JsonNumber::Float,
            _ => return Ok(Transformed::no(expr)),
        };
        if f.func.inner().as_any().is::<JsonGetNumber>() {
            return Ok(Transformed::no(expr));
        }
        Ok(Transformed::yes(Expr::ScalarFunction(ScalarFunction {
            func: kind.udf(),
            args: f.args.clone(),
        })))
    }
}

/// `median` that treats integers as doubles (see the module docs).
#[derive(Debug, PartialEq, Eq, Hash)]
struct MedianAsDouble {
    inner: Median,
    signature: Signature,
}

impl Default for MedianAsDouble {
    fn default() -> Self {
        MedianAsDouble {
            inner: Median::new(),
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

impl AggregateUDFImpl for MedianAsDouble {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn name(&self) -> &str {
        self.inner.name()
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> DFResult<Vec<DataType>> {
        match arg_types {
            [t] if t.is_integer() => Ok(vec![DataType::Float64]),
            [t] if t.is_numeric() || t.is_null() => Ok(vec![t.clone()]),
            [t] => datafusion::common::plan_err!("median of {t} is not supported"),
            _ => datafusion::common::plan_err!("median takes one argument"),
        }
    }

    fn return_type(&self, arg_types: &[DataType]) -> DFResult<DataType> {
        self.inner.return_type(arg_types)
    }

    fn state_fields(&self, args: StateFieldsArgs) -> DFResult<Vec<FieldRef>> {
        self.inner.state_fields(args)
    }

    fn accumulator(&self, args: AccumulatorArgs) -> DFResult<Box<dyn Accumulator>> {
        self.inner.accumulator(args)
    }

    fn groups_accumulator_supported(&self, args: AccumulatorArgs) -> bool {
        self.inner.groups_accumulator_supported(args)
    }

    fn create_groups_accumulator(
        &self,
        args: AccumulatorArgs,
    ) -> DFResult<Box<dyn GroupsAccumulator>> {
        self.inner.create_groups_accumulator(args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::Float64Array;

    async fn one(sql: &str) -> f64 {
        let mut ctx = SessionContext::new();
        datafusion_functions_json::register_all(&mut ctx).expect("json functions");
        register(&mut ctx).expect("registers");
        let batches = ctx
            .sql(sql)
            .await
            .expect("plans")
            .collect()
            .await
            .expect("runs");
        batches[0]
            .column(0)
            .as_any()
            .downcast_ref::<Float64Array>()
            .expect("a double")
            .value(0)
    }

    #[tokio::test]
    async fn the_median_of_integers_is_the_mean_of_the_middle_two() {
        let m = one("SELECT median(x) FROM (VALUES (1), (2), (4), (7)) AS t(x)").await;
        assert_eq!(m, 3.0);
        let grouped = "SELECT median(x) FROM (VALUES (1, 'a'), (2, 'a')) AS t(x, g) GROUP BY g";
        assert_eq!(one(grouped).await, 1.5);
    }

    #[tokio::test]
    async fn json_numbers_are_read_whatever_their_sign() {
        let doc = r#"'{"a": -3, "b": {"c": [1, -2.5]}, "big": 1234567890123456789}'"#;
        let int = format!("SELECT CAST(json_get_int({doc}, 'a') AS DOUBLE)");
        assert_eq!(one(&int).await, -3.0);
        let float = format!("SELECT json_get_float({doc}, 'b', 'c', 1)");
        assert_eq!(one(&float).await, -2.5);
        let cast = format!("SELECT CAST(CAST(json_get({doc}, 'a') AS BIGINT) AS DOUBLE)");
        assert_eq!(one(&cast).await, -3.0);
        let big =
            format!("SELECT CAST(json_get_int({doc}, 'big') - 1234567890123456000 AS DOUBLE)");
        assert_eq!(one(&big).await, 789.0);
        let last = format!("SELECT json_get_float({doc}, 'b', 'c', -1)");
        assert_eq!(one(&last).await, -2.5);
    }

    #[tokio::test]
    async fn doubles_keep_their_median() {
        let m = one("SELECT median(x) FROM (VALUES (1.5), (2.5), (10.0)) AS t(x)").await;
        assert_eq!(m, 2.5);
    }
}
