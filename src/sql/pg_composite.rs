//! PostgreSQL's composite values in a query: `(expr).field` reads a field of a row value, and
//! `information_schema._pg_expandarray(array)`, the set-returning function pgjdbc's
//! `getPrimaryKeys` and `getIndexInfo` use, yields one row `(x, n)` per element (the element
//! and its 1-based position).
//!
//! Both are rewritten on the parsed statement, before DataFusion plans it:
//! - `(e).f` becomes `(e)['f']`, DataFusion's struct field access (an unquoted field name folds
//!   to lower case, as PostgreSQL folds it).
//! - `_pg_expandarray(a)` in a select list becomes `unnest(pg_expandarray_list(a))`: the scalar
//!   [`expand_array`] turns each array into the array of its `{x, n}` rows and `unnest` gives
//!   one output row per element, as PostgreSQL's set-returning call does. Several such calls
//!   in one select list expand in step, PostgreSQL's rule since version 10, which is what
//!   DataFusion's unnest of lists of the same length does. Anywhere else (WHERE, FROM) the call
//!   is left alone and fails to plan, as a set-returning function there fails in PostgreSQL.
//!   The copied catalog tables hold `int2[]` and `int2vector` columns as text (`[1, 2]`,
//!   `1 2`): such text is read as the array of integers it spells.
//!
//! Invariant: the rewrites touch only `(…).field` accesses and calls named `_pg_expandarray`;
//! every other statement is unchanged.

use std::any::Any;
use std::ops::ControlFlow;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, Int32Builder, Int64Builder, ListArray, ListBuilder, StructArray,
};
use arrow::buffer::OffsetBuffer;
use arrow::compute::cast;
use arrow::datatypes::{DataType, Field, Fields};
use datafusion::common::{exec_err, plan_err, Result as DFResult, ScalarValue};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use datafusion::sql::sqlparser::ast::{
    AccessExpr, Expr, Function, FunctionArg, FunctionArgExpr, FunctionArgumentList,
    FunctionArguments, Ident, ObjectName, ObjectNamePart, Query, SelectItem, SetExpr, Statement,
    Subscript, Value, VisitMut, VisitorMut,
};

/// The name of the scalar that turns an array into its `{x, n}` rows.
const LIST_FUNCTION: &str = "pg_expandarray_list";

/// Rewrites `statement`'s composite accesses and `_pg_expandarray` calls (see the module doc).
pub(crate) fn rewrite(statement: &mut Statement) {
    let _ = statement.visit(&mut Composite);
}

struct Composite;

impl VisitorMut for Composite {
    type Break = ();

    fn post_visit_expr(&mut self, e: &mut Expr) -> ControlFlow<()> {
        if let Expr::CompoundFieldAccess { root, access_chain } = e {
            if matches!(root.as_ref(), Expr::Nested(_)) {
                for access in access_chain.iter_mut() {
                    if let AccessExpr::Dot(Expr::Identifier(field)) = access {
                        let name = match field.quote_style {
                            Some(_) => field.value.clone(),
                            None => field.value.to_lowercase(),
                        };
                        *access = AccessExpr::Subscript(Subscript::Index {
                            index: Expr::Value(Value::SingleQuotedString(name).into()),
                        });
                    }
                }
            }
        }
        ControlFlow::Continue(())
    }

    fn post_visit_query(&mut self, query: &mut Query) -> ControlFlow<()> {
        expand_in_select_lists(&mut query.body);
        ControlFlow::Continue(())
    }
}

/// Wraps the `_pg_expandarray` calls of the select lists of `body` (not of nested queries,
/// which are visited on their own) in `unnest`.
fn expand_in_select_lists(body: &mut SetExpr) {
    match body {
        SetExpr::Select(select) => {
            for item in select.projection.iter_mut() {
                if let SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } = item
                {
                    let _ = e.visit(&mut ExpandCalls);
                }
            }
        }
        SetExpr::SetOperation { left, right, .. } => {
            expand_in_select_lists(left);
            expand_in_select_lists(right);
        }
        _ => {}
    }
}

struct ExpandCalls;

impl VisitorMut for ExpandCalls {
    type Break = ();

    fn post_visit_expr(&mut self, e: &mut Expr) -> ControlFlow<()> {
        let Expr::Function(call) = e else {
            return ControlFlow::Continue(());
        };
        let is_expand = call.name.0.last().is_some_and(|p| {
            matches!(p, ObjectNamePart::Identifier(i) if i.value.eq_ignore_ascii_case("_pg_expandarray"))
        });
        if is_expand && call.over.is_none() {
            let mut list = call.clone();
            list.name = ObjectName::from(vec![Ident::new(LIST_FUNCTION)]);
            let mut unnest: Function = call.clone();
            unnest.name = ObjectName::from(vec![Ident::new("unnest")]);
            unnest.args = FunctionArguments::List(FunctionArgumentList {
                duplicate_treatment: None,
                args: vec![FunctionArg::Unnamed(FunctionArgExpr::Expr(Expr::Function(
                    list,
                )))],
                clauses: vec![],
            });
            *e = Expr::Function(unnest);
        }
        ControlFlow::Continue(())
    }
}

/// `pg_expandarray_list(array)`: the array of `{x: element, n: position}` rows of each array
/// (NULL for NULL).
pub(crate) fn expand_array() -> ScalarUDF {
    ScalarUDF::from(ExpandArray {
        signature: Signature::any(1, Volatility::Immutable),
    })
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct ExpandArray {
    signature: Signature,
}

fn row_fields(element: &Field) -> Fields {
    Fields::from(vec![
        Field::new("x", element.data_type().clone(), true),
        Field::new("n", DataType::Int32, false),
    ])
}

impl ScalarUDFImpl for ExpandArray {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn name(&self) -> &str {
        LIST_FUNCTION
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> DFResult<DataType> {
        match args.first() {
            Some(DataType::List(element)) => Ok(DataType::new_list(
                DataType::Struct(row_fields(element)),
                true,
            )),
            Some(DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View) => Ok(
                DataType::new_list(DataType::Struct(row_fields(&text_element())), true),
            ),
            other => plan_err!("_pg_expandarray expects an array, got {other:?}"),
        }
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DFResult<ColumnarValue> {
        let Some(arg) = args.args.first() else {
            return exec_err!("_pg_expandarray takes one argument");
        };
        let (mut array, scalar) = match arg {
            ColumnarValue::Array(a) => (a.clone(), false),
            ColumnarValue::Scalar(s) => (s.to_array()?, true),
        };
        if matches!(
            array.data_type(),
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
        ) {
            array = Arc::new(parse_text_arrays(&cast(&array, &DataType::Utf8)?));
        }
        let Some(lists) = array.as_list_opt::<i32>() else {
            return exec_err!(
                "_pg_expandarray expects an array, got {}",
                array.data_type()
            );
        };
        let out = expand(lists)?;
        Ok(if scalar {
            ColumnarValue::Scalar(ScalarValue::try_from_array(&out, 0)?)
        } else {
            ColumnarValue::Array(out)
        })
    }
}

/// The element of an array held as text: the copied catalog tables keep `int2[]` and
/// `int2vector` columns (`pg_constraint.conkey`, `pg_index.indkey`) as their text.
fn text_element() -> Field {
    Field::new_list_field(DataType::Int64, true)
}

/// Arrays held as text (`{1,2}`, `[1, 2]` or int2vector's `1 2`) as lists of integers; an
/// element that is not an integer is NULL, a NULL text a NULL list.
fn parse_text_arrays(texts: &ArrayRef) -> ListArray {
    let texts = texts.as_string::<i32>();
    let mut lists = ListBuilder::new(Int64Builder::new()).with_field(Arc::new(text_element()));
    for text in texts.iter() {
        match text {
            Some(t) => {
                let inner = t
                    .trim()
                    .trim_matches(|c| matches!(c, '{' | '}' | '[' | ']'));
                for item in inner
                    .split(|c: char| c == ',' || c.is_whitespace())
                    .filter(|i| !i.is_empty())
                {
                    lists.values().append_option(item.parse::<i64>().ok());
                }
                lists.append(true);
            }
            None => lists.append(false),
        }
    }
    lists.finish()
}

/// Each list of `lists` as the list of its `{x, n}` rows.
fn expand(lists: &ListArray) -> DFResult<ArrayRef> {
    let offsets = lists.offsets();
    let start = offsets.first().copied().unwrap_or(0);
    let end = offsets.last().copied().unwrap_or(0);
    let values = lists.values().slice(start as usize, (end - start) as usize);
    let mut positions = Int32Builder::with_capacity(values.len());
    for w in offsets.windows(2) {
        for n in 1..=(w[1] - w[0]) {
            positions.append_value(n);
        }
    }
    let DataType::List(element) = lists.data_type() else {
        return exec_err!("_pg_expandarray expects an array");
    };
    let fields = row_fields(element);
    let rows = StructArray::try_new(
        fields.clone(),
        vec![values, Arc::new(positions.finish())],
        None,
    )?;
    let rebased = OffsetBuffer::new(offsets.iter().map(|o| o - start).collect());
    Ok(Arc::new(ListArray::try_new(
        Arc::new(Field::new_list_field(DataType::Struct(fields), true)),
        rebased,
        Arc::new(rows),
        lists.nulls().cloned(),
    )?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::Int16Array;
    use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
    use datafusion::sql::sqlparser::parser::Parser;

    fn rewritten(sql: &str) -> String {
        let mut s = Parser::parse_sql(&PostgreSqlDialect {}, sql).expect("parse");
        rewrite(&mut s[0]);
        s[0].to_string()
    }

    #[test]
    fn composite_access_and_set_returning_calls_are_rewritten() {
        assert_eq!(
            rewritten("SELECT (information_schema._pg_expandarray(c.k)).N AS s FROM c"),
            "SELECT (unnest(pg_expandarray_list(c.k)))['n'] AS s FROM c"
        );
        assert_eq!(
            rewritten("SELECT r.a FROM (SELECT _pg_expandarray(k) AS keys FROM c) r WHERE r.a = (r.keys).x"),
            "SELECT r.a FROM (SELECT unnest(pg_expandarray_list(k)) AS keys FROM c) r WHERE r.a = (r.keys)['x']"
        );
        // Not in a select list: left alone (it fails to plan, as in PostgreSQL).
        assert_eq!(
            rewritten("SELECT 1 FROM c WHERE _pg_expandarray(k) IS NULL"),
            "SELECT 1 FROM c WHERE _pg_expandarray(k) IS NULL"
        );
        // Plain qualified names are not composite accesses.
        assert_eq!(rewritten("SELECT t.a.b FROM t"), "SELECT t.a.b FROM t");
    }

    #[test]
    fn arrays_held_as_text_are_read_as_integers() {
        let texts: ArrayRef = Arc::new(arrow::array::StringArray::from(vec![
            Some("[2, 20, 3]"),
            Some("1 2"),
            Some("{7}"),
            None,
            Some("[]"),
        ]));
        let lists = parse_text_arrays(&texts);
        let values = |i: usize| {
            lists
                .value(i)
                .as_primitive::<arrow::datatypes::Int64Type>()
                .iter()
                .collect::<Vec<_>>()
        };
        assert_eq!(values(0), vec![Some(2), Some(20), Some(3)]);
        assert_eq!(values(1), vec![Some(1), Some(2)]);
        assert_eq!(values(2), vec![Some(7)]);
        assert!(lists.is_null(3));
        assert_eq!(values(4), vec![]);
    }

    #[test]
    fn arrays_expand_to_element_and_position_rows() {
        let lists = ListArray::from_iter_primitive::<arrow::datatypes::Int16Type, _, _>(vec![
            Some(vec![Some(3), Some(1)]),
            None,
            Some(vec![]),
            Some(vec![Some(7)]),
        ]);
        let out = expand(&lists).expect("expand");
        let out = out.as_list::<i32>();
        assert_eq!(out.len(), 4);
        assert!(out.is_null(1));
        assert_eq!(out.value(2).len(), 0);
        let first = out.value(0);
        let rows = first.as_struct();
        let x = rows
            .column(0)
            .as_any()
            .downcast_ref::<Int16Array>()
            .cloned();
        assert_eq!(x, Some(Int16Array::from(vec![3, 1])));
        assert_eq!(
            rows.column(1)
                .as_primitive::<arrow::datatypes::Int32Type>()
                .values()
                .to_vec(),
            vec![1, 2]
        );
        // A slice starting past the first list's elements.
        let tail = expand(&lists.slice(3, 1)).expect("expand");
        let last = tail.as_list::<i32>().value(0);
        let rows = last.as_struct();
        assert_eq!(rows.len(), 1);
        assert_eq!(
            rows.column(0)
                .as_primitive::<arrow::datatypes::Int16Type>()
                .value(0),
            7
        );
        assert_eq!(
            rows.column(1)
                .as_primitive::<arrow::datatypes::Int32Type>()
                .value(0),
            1
        );
    }
}
