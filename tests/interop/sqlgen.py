"""Differential SQL testing: run one query on ledgerlake (the real `psql` binary and HTTP
`POST /sql` as an Arrow stream) and on DuckDB over the same committed Iceberg table, bring every
result to one canonical form and compare; plus a seeded generator of queries over a table's
columns.

Canonical values (what two engines must agree on):
- NULL is `None` (psql prints a sentinel for NULL, so an empty string stays an empty string);
- integers are `int` (DuckDB's HUGEINT/DECIMAL sums of integers too), other numbers `float`,
  compared with a relative tolerance (`REL_TOL`: float32 values and sums in another order);
- timestamps are `("ts", microseconds since the epoch, UTC)` whether the engine types them with
  a zone or not (both sessions run in UTC), dates `("date", "YYYY-MM-DD")`;
- structs and maps are `("obj", sorted (key, value) pairs)` (psql shows both as JSON objects),
  lists `("list", values)`, binary values `bytes`.
Nothing else is folded: a different number of rows or columns, NULL against a value, a string
against a number, are all differences. Rows are sorted before comparing unless the query's
ORDER BY is total (`Query.ordered`); column names are not compared (each engine names
expressions its own way).

Surfaces: HTTP with `Accept: application/vnd.apache.arrow.stream` (its schema types the other
surfaces' text), `psql --csv` with a NULL sentinel (one psql session runs a whole batch of
queries, see `PsqlSession`; a one-column row holding '' prints as an empty line), and HTTP JSON
rows read as ordered (name, value) pairs (two columns may share a name).
"""
import csv
import datetime
import decimal
import io
import json
import math
import os
import random
import re
import subprocess
import urllib.error
import urllib.request

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc

REL_TOL = 1e-6
ABS_TOL = 1e-9
NULL = "\u2400NULL\u2400"  # what psql prints for NULL (never a value of the data)
ARROW_STREAM = "application/vnd.apache.arrow.stream"


class Query:
    """One query: the ledgerlake (DataFusion) text, the DuckDB text (the same unless the
    dialects differ) and whether its ORDER BY is total (rows compared in order; otherwise
    compared as multisets)."""

    def __init__(self, name, ll, duck=None, ordered=False):
        self.name = name
        self.ll = " ".join(ll.split())
        self.duck = " ".join((duck or ll).split())
        self.ordered = ordered

    def __repr__(self):
        if self.ll == self.duck:
            return f"[{self.name}] {self.ll}"
        return f"[{self.name}]\n  ledgerlake: {self.ll}\n  duckdb:     {self.duck}"


# ----------------------------------------------------------------------------- canonical form

def _micros(unit, v):
    return {"s": v * 1_000_000, "ms": v * 1000, "us": v, "ns": v // 1000}[unit]


def _number(v):
    if isinstance(v, decimal.Decimal):
        if v.is_finite() and v == v.to_integral_value():
            return int(v)
        return float(v)
    return v


def canon(v, t):
    """A Python value from Arrow's `to_pylist` (of type `t`) in canonical form."""
    if v is None:
        return None
    if pa.types.is_map(t):
        return ("obj", tuple(sorted((str(k), canon(x, t.item_type)) for k, x in v)))
    if pa.types.is_struct(t):
        types = {t.field(i).name: t.field(i).type for i in range(t.num_fields)}
        return ("obj", tuple(sorted((k, canon(x, types[k])) for k, x in v.items())))
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t) \
            or pa.types.is_list_view(t) or pa.types.is_large_list_view(t):
        return ("list", tuple(canon(x, t.value_type) for x in v))
    if pa.types.is_timestamp(t):
        if isinstance(v, datetime.datetime):
            if v.tzinfo is None:
                v = v.replace(tzinfo=datetime.timezone.utc)
            delta = v - datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
            return ("ts", delta // datetime.timedelta(microseconds=1))
        return ("ts", _micros(t.unit, int(v)))
    if pa.types.is_date(t):
        return ("date", v.isoformat())
    if pa.types.is_decimal(t):
        return _number(v)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t) \
            or pa.types.is_binary_view(t):
        return bytes(v)
    if isinstance(v, (bool, int, float, str)):
        return v  # also the value of a union's active member
    return ("other", str(v))


def _column_values(col):
    t = col.type
    if pa.types.is_timestamp(t):
        # Through int64: to_pylist would drop nanoseconds or need pandas.
        ints = pc.cast(col, pa.int64()).to_pylist()
        return [None if v is None else ("ts", _micros(t.unit, v)) for v in ints]
    return [canon(v, t) for v in col.to_pylist()]


def arrow_rows(table):
    """The rows of an Arrow table, canonical."""
    cols = [_column_values(table.column(i)) for i in range(table.num_columns)]
    return [tuple(c[r] for c in cols) for r in range(table.num_rows)]


_TS = re.compile(r"^(\d{4}-\d\d-\d\d)[ T](\d\d:\d\d:\d\d(?:\.\d+)?)([+-]\d\d(?::?\d\d)?|Z)?$")


def _parse_ts(text):
    m = _TS.match(text)
    if not m:
        raise ValueError(f"not a timestamp: {text!r}")
    day, clock, zone = m.groups()
    if "." in clock:
        whole, frac = clock.split(".")
        clock = whole + "." + (frac + "000000")[:6]
    dt = datetime.datetime.fromisoformat(f"{day}T{clock}")
    offset = datetime.timedelta(0)
    if zone and zone != "Z":
        sign = -1 if zone[0] == "-" else 1
        digits = zone[1:].replace(":", "")
        offset = sign * datetime.timedelta(hours=int(digits[:2]), minutes=int(digits[2:] or 0))
    dt = dt.replace(tzinfo=datetime.timezone.utc) - offset
    delta = dt - datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
    return ("ts", delta // datetime.timedelta(microseconds=1))


def _canon_json(v, t):
    """A value of psql's JSON rendering of a nested Arrow value of type `t`."""
    if v is None:
        return None
    if pa.types.is_map(t):
        if isinstance(v, dict):
            items = v.items()
        else:  # maps with non-string keys may come as a list of {key, value}
            items = ((e["key"], e["value"]) for e in v)
        return ("obj", tuple(sorted((str(k), _canon_json(x, t.item_type)) for k, x in items)))
    if pa.types.is_struct(t):
        types = {t.field(i).name: t.field(i).type for i in range(t.num_fields)}
        return ("obj", tuple(sorted((k, _canon_json(x, types[k])) for k, x in v.items())))
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return ("list", tuple(_canon_json(x, t.value_type) for x in v))
    if pa.types.is_timestamp(t):
        return _parse_ts(v)
    if pa.types.is_date(t):
        return ("date", v)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return bytes.fromhex(v)
    return v


def _parse_cell(text, t):
    if text == NULL:
        return None
    if pa.types.is_boolean(t):
        return {"t": True, "f": False}[text]
    if pa.types.is_integer(t):
        return int(text)
    if pa.types.is_floating(t):
        return float({"Infinity": "inf", "-Infinity": "-inf"}.get(text, text))
    if pa.types.is_decimal(t):
        return _number(decimal.Decimal(text))
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t) \
            or pa.types.is_binary_view(t):
        assert text.startswith("\\x"), text
        return bytes.fromhex(text[2:])
    if pa.types.is_timestamp(t):
        return _parse_ts(text)
    if pa.types.is_date(t):
        return ("date", text)
    if pa.types.is_map(t) or pa.types.is_struct(t) or pa.types.is_list(t) \
            or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _canon_json(json.loads(text), t)
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return text
    if pa.types.is_union(t):
        # A union (json_get, ->) is sent as the JSON of its active member.
        v = json.loads(text)
        return v if isinstance(v, (bool, int, float, str)) else ("other", text)
    return ("other", text)


def psql_rows(text, schema):
    """The rows of `psql --csv` output, typed by the Arrow schema of the same query."""
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    assert header is not None, f"psql printed no header: {text!r}"
    assert len(header) == len(schema), (header, schema)
    types = [f.type for f in schema]
    rows = []
    for row in reader:
        if not row and len(types) == 1:
            row = [""]  # one empty-string column prints as an empty line (NULL is NULL)
        rows.append(tuple(_parse_cell(c, t) for c, t in zip(row, types)))
    return rows


# ----------------------------------------------------------------------------- comparison

def _is_num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def values_equal(a, b):
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if _is_num(a) and _is_num(b):
        if isinstance(a, int) and isinstance(b, int):
            return a == b
        a, b = float(a), float(b)
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=ABS_TOL)
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(values_equal(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _sort_key(v):
    if v is None:
        return (0,)
    if isinstance(v, bool):
        return (1, v)
    if _is_num(v):
        f = float(v)
        return (2, 0.0 if math.isnan(f) else float(f"{f:.5g}"), math.isnan(f))
    if isinstance(v, str):
        return (3, v)
    if isinstance(v, bytes):
        return (4, v)
    if isinstance(v, tuple):
        return (5, tuple(_sort_key(x) for x in v))
    return (6, repr(v))


def rows_equal(a, b):
    return len(a) == len(b) and all(values_equal(x, y) for x, y in zip(a, b))


def compare(want, got, ordered):
    """None when the row lists agree, else a short description of the first difference."""
    if len(want) != len(got):
        return f"{len(want)} rows against {len(got)}" + _first_extra(want, got)
    if want and len(want[0]) != len(got[0]):
        return f"{len(want[0])} columns against {len(got[0])}"
    if not ordered:
        want = sorted(want, key=_sort_key)
        got = sorted(got, key=_sort_key)
    for i, (x, y) in enumerate(zip(want, got)):
        if not rows_equal(x, y):
            if not ordered and _matches_as_multiset(want, got):
                return None
            return f"row {i}: {x!r} against {y!r}"
    return None


def _matches_as_multiset(want, got):
    """Greedy pairing under the tolerance (sorting may split rows whose floats differ in the
    last digits)."""
    left = list(got)
    for row in want:
        for j, other in enumerate(left):
            if rows_equal(row, other):
                del left[j]
                break
        else:
            return False
    return True


def _first_extra(want, got):
    a = sorted(want, key=_sort_key)
    b = sorted(got, key=_sort_key)
    only_a = [r for r in a if not any(rows_equal(r, x) for x in b)][:3]
    only_b = [r for r in b if not any(rows_equal(r, x) for x in a)][:3]
    return f"; only in the first: {only_a!r}; only in the second: {only_b!r}"


# ----------------------------------------------------------------------------- the engines

class QueryError(Exception):
    """An engine refused or failed a query."""


class Ledgerlake:
    """Queries a running service through psql and HTTP."""

    def __init__(self, svc):
        self.svc = svc

    def psql(self, sql, schema):
        env = dict(os.environ, PGCONNECT_TIMEOUT="10")
        env.pop("PGPASSWORD", None)
        r = subprocess.run(
            ["psql", "-h", "127.0.0.1", "-p", str(self.svc.pg_port), "-U", "diff", "-d", "lake",
             "-X", "-q", "--csv", "-P", f"null={NULL}", "-v", "ON_ERROR_STOP=1", "-w",
             "-c", sql],
            capture_output=True, text=True, env=env, timeout=120)
        if r.returncode != 0:
            raise QueryError(r.stderr.strip())
        return psql_rows(r.stdout, schema)

    def psql_session(self, sqls):
        """Starts one psql process running every statement of `sqls` in order (one session,
        `ON_ERROR_STOP=0`); `PsqlSession.texts()` gives each statement's CSV text or its
        error. Saves psql's start-up and connection per query."""
        return PsqlSession(self.svc, sqls)

    def http(self, sql, accept=ARROW_STREAM):
        req = urllib.request.Request(f"{self.svc.http}/sql", data=sql.encode(), method="POST",
                                     headers={"Accept": accept, "Content-Type": "text/plain"})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                body = r.read()
        except urllib.error.HTTPError as e:
            raise QueryError(f"HTTP {e.code}: {e.read().decode(errors='replace')}") from None
        if accept == ARROW_STREAM:
            return pyarrow.ipc.open_stream(body).read_all()
        # Rows as (name, value) pairs in order: two columns may share a name (`a.n, b.n`).
        return json.loads(body, object_pairs_hook=_Pairs)

    def run(self, sql, surfaces=("http", "psql")):
        """Rows per surface: HTTP as an Arrow stream (its schema types the others), psql
        (`--csv`), HTTP JSON. Raises QueryError when the Arrow request fails; another surface's
        failure is its entry (a QueryError)."""
        table = self.http(sql)
        out = {"http": arrow_rows(table)}
        for surface in surfaces:
            try:
                if surface == "psql":
                    out["psql"] = self.psql(sql, table.schema)
                elif surface == "json":
                    out["json"] = json_rows(self.http(sql, "application/json"), table.schema)
            except QueryError as e:
                out[surface] = e
        return table.schema, out


class PsqlSession:
    """One `psql -f script` run. The script echoes a marker line before each statement (to
    split stdout) and puts each statement on its own line (psql names that line in the
    statement's error on stderr)."""

    MARK = "@@ll-diff-statement@@"

    def __init__(self, svc, sqls):
        import tempfile
        self.count = len(sqls)
        fd, self.path = tempfile.mkstemp(prefix="ll-diff-", suffix=".sql")
        with os.fdopen(fd, "w") as f:
            for i, sql in enumerate(sqls):
                assert "\n" not in sql and "\\" not in sql, sql
                f.write(f"\\echo {self.MARK}{i}\n{sql};\n")
        env = dict(os.environ, PGCONNECT_TIMEOUT="10")
        env.pop("PGPASSWORD", None)
        self.proc = subprocess.Popen(
            ["psql", "-h", "127.0.0.1", "-p", str(svc.pg_port), "-U", "diff", "-d", "lake",
             "-X", "-q", "--csv", "-P", f"null={NULL}", "-v", "ON_ERROR_STOP=0", "-w",
             "-f", self.path],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)

    def texts(self, timeout=600):
        try:
            out, err = self.proc.communicate(timeout=timeout)
        finally:
            os.unlink(self.path)
        if self.proc.returncode not in (0, 1, 3):
            failed = QueryError(f"psql exited {self.proc.returncode}: {err.strip()}")
            return [failed] * self.count
        texts = [None] * self.count
        current = None
        chunks = {}
        for line in out.splitlines(keepends=True):
            if line.startswith(self.MARK):
                current = int(line[len(self.MARK):])
                chunks[current] = []
            elif current is not None:
                chunks[current].append(line)
        errors = {}
        last = None
        for line in err.splitlines():
            m = re.match(r"^psql:[^:]*:(\d+): (.*)$", line)
            if m:
                last = (int(m.group(1)) - 2) // 2  # statement i is on line 2i + 2
                errors.setdefault(last, []).append(m.group(2))
            elif last is not None:
                errors[last].append(line)
        for i in range(self.count):
            if i in errors:
                texts[i] = QueryError("\n".join(errors[i]).strip())
            elif i in chunks and chunks[i]:
                texts[i] = "".join(chunks[i])
            else:
                texts[i] = QueryError(f"psql printed nothing for statement {i}: {err.strip()}")
        return texts


class _Pairs(list):
    """A JSON object as its (name, value) pairs."""


def _objects(v):
    if isinstance(v, _Pairs):
        return {k: _objects(x) for k, x in v}
    if isinstance(v, list):
        return [_objects(x) for x in v]
    return v


def json_rows(objs, schema):
    """HTTP JSON rows (arrow-json's rendering, every column present, in order) in canonical
    form."""
    names = [f.name for f in schema]
    rows = []
    for o in objs:
        assert [k for k, _ in o] == names, (o, names)
        rows.append(tuple(_json_cell(v, f.type) for (_, v), f in zip(o, schema)))
    return rows


def _json_cell(v, t):
    v = _objects(v)
    if v is None:
        return None
    if pa.types.is_timestamp(t):
        return _parse_ts(v)
    if pa.types.is_decimal(t):
        return _number(decimal.Decimal(str(v)))
    if pa.types.is_floating(t) and isinstance(v, int):
        return float(v)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return bytes.fromhex(v)
    if pa.types.is_map(t) or pa.types.is_struct(t) or pa.types.is_list(t) \
            or pa.types.is_large_list(t):
        return _canon_json(v, t)
    if pa.types.is_date(t):
        return ("date", v)
    return v


class DuckSide:
    """DuckDB over the data files of each table's current snapshot (listed by PyIceberg):
    one view per topic table with the Iceberg schema's columns, same names as ledgerlake's."""

    def __init__(self, tables):
        import duckdb
        self.con = duckdb.connect()
        self.con.execute("SET TimeZone = 'UTC'")
        # PostgreSQL's (and DataFusion's) default: NULLs last ascending, first descending.
        self.con.execute("SET default_null_order = 'nulls_last_on_asc_first_on_desc'")
        self.con.execute("SET threads = 1")
        for name, table in tables.items():
            files = []
            for row in table.inspect.files().to_pylist():
                assert row["content"] == 0, f"{name}: delete files are not expected: {row}"
                path = row["file_path"]
                assert path.startswith("file:"), path
                files.append(path[len("file:"):])
            assert files, f"{name}: no data files"
            cols = ", ".join(f'"{f.name}"' for f in table.schema().fields)
            self.con.execute(
                f"CREATE VIEW {name} AS SELECT {cols} FROM read_parquet({files!r}, "
                "hive_partitioning = false, union_by_name = true)")
        # JSON accessors with datafusion-functions-json's semantics: NULL when the payload is
        # not JSON or the value has another JSON type.
        for macro in [
            "CREATE MACRO jdoc(p) AS CASE WHEN json_valid(decode(p)) THEN decode(p)::JSON END",
            "CREATE MACRO jstr(p, path) AS CASE WHEN json_type(jdoc(p), path) = 'VARCHAR' "
            "THEN json_extract_string(jdoc(p), path) END",
            "CREATE MACRO jint(p, path) AS CASE WHEN json_type(jdoc(p), path) IN "
            "('BIGINT', 'UBIGINT') THEN CAST(json_extract(jdoc(p), path) AS BIGINT) END",
            "CREATE MACRO jfloat(p, path) AS CASE WHEN json_type(jdoc(p), path) IN "
            "('BIGINT', 'UBIGINT', 'DOUBLE') THEN CAST(json_extract(jdoc(p), path) AS DOUBLE) END",
            "CREATE MACRO jbool(p, path) AS CASE WHEN json_type(jdoc(p), path) = 'BOOLEAN' "
            "THEN CAST(json_extract(jdoc(p), path) AS BOOLEAN) END",
        ]:
            self.con.execute(macro)

    def run(self, sql):
        try:
            table = self.con.sql(sql).to_arrow_table()
        except Exception as e:  # noqa: BLE001 - any DuckDB error is the query's failure
            raise QueryError(f"DuckDB: {e}") from None
        return arrow_rows(table)

    def close(self):
        self.con.close()


def check(ll, duck, q, surfaces=("http", "psql")):
    """Runs `q` everywhere; returns None when all agree, else a description."""
    return check_many(ll, duck, [q], surfaces)[0]


def check_many(ll, duck, queries, surfaces=("http", "psql")):
    """Runs each query on DuckDB and on ledgerlake's surfaces (psql: one session for all,
    running while the HTTP requests are made); per query None when all agree, else a
    description of every difference."""
    session = ll.psql_session([q.ll for q in queries]) if "psql" in surfaces else None
    problems = [None] * len(queries)
    wants, results = {}, {}
    for i, q in enumerate(queries):
        try:
            wants[i] = duck.run(q.duck)
        except QueryError as e:
            problems[i] = f"{q!r}\n  DuckDB failed (a bad test query?): {e}"
            continue
        try:
            results[i] = ll.run(q.ll, [s for s in surfaces if s != "psql"])
        except QueryError as e:
            problems[i] = f"{q!r}\n  ledgerlake failed: {e}\n  DuckDB: {_show(wants[i])}"
    texts = session.texts() if session else [None] * len(queries)
    for i, (schema, got) in results.items():
        q, want = queries[i], wants[i]
        if session:
            text = texts[i]
            if isinstance(text, QueryError):
                got["psql"] = text
            else:
                try:
                    got["psql"] = psql_rows(text, schema)
                except (AssertionError, ValueError, KeyError) as e:
                    got["psql"] = QueryError(f"psql output not understood ({e}): {text[:300]!r}")
        found = []
        for surface, rows in got.items():
            if isinstance(rows, QueryError):
                found.append(f"  ledgerlake failed on {surface} only: {rows}")
                continue
            diff = compare(want, rows, q.ordered)
            if diff:
                found.append(f"  {surface} differs from DuckDB: {diff}\n"
                             f"    ledgerlake ({surface}): {_show(rows)}\n"
                             f"    DuckDB: {_show(want)}")
        if found:
            problems[i] = f"{q!r}\n" + "\n".join(found)
    return problems


def _show(rows, limit=6):
    text = repr(rows[:limit])
    if len(rows) > limit:
        text += f" ... ({len(rows)} rows)"
    return text if len(text) < 1500 else text[:1500] + "..."


# ----------------------------------------------------------------------------- the generator

class Col:
    """A column (or an expression over columns) the generator may use.

    kind: int | float | str | ts | bool; `ll`/`duck`: its SQL in each dialect; `values`:
    literals to compare it with (filled from the data by `profile`)."""

    def __init__(self, name, kind, ll=None, duck=None, nullable=True, group=True, agg=True,
                 filter=True):
        self.name = name
        self.kind = kind
        self.ll = ll or name
        self.duck = duck or self.ll
        self.nullable = nullable
        self.group = group
        self.agg = agg
        self.filter = filter
        self.values = []


class Spec:
    """A table for the generator: its name, columns and a unique row order."""

    def __init__(self, name, cols, unique=("ledger_id", "entry_id", "batch_index", "partition")):
        self.name = name
        self.cols = cols
        self.unique = unique


def _lit(col, v):
    if v is None:
        return "NULL"
    if col.kind == "int":
        return str(v)
    if col.kind == "float":
        return repr(float(v))
    if col.kind == "bool":
        return "true" if v else "false"
    if col.kind == "ts":
        dt = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc) + \
            datetime.timedelta(microseconds=v)
        return "'" + dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ") + "'"
    return "'" + str(v).replace("'", "''") + "'"


def profile(duck, spec, per_col=40, rng=None):
    """Fills each column's literal pool from the committed data (DuckDB): a sample of its
    distinct values, its extremes and values just outside them."""
    rng = rng or random.Random(0)
    for c in spec.cols:
        expr = c.duck
        if c.kind == "ts":
            expr = f"epoch_us({c.duck})"
        rows = duck.con.execute(
            f"SELECT DISTINCT {expr} AS v FROM {spec.name} WHERE {expr} IS NOT NULL "
            f"ORDER BY v").fetchall()
        values = [r[0] for r in rows]
        if not values:
            c.values = []
            continue
        sample = values if len(values) <= per_col else \
            [values[0], values[-1]] + rng.sample(values, per_col - 2)
        extra = []
        if c.kind in ("int", "ts"):
            step = 1000 if c.kind == "ts" else 1
            extra = [values[0] - step, values[-1] + step]
        elif c.kind == "float":
            extra = [values[0] - 1.0, values[-1] + 1.0]
        elif c.kind == "str":
            extra = ["", "zzz-not-there"]
        c.values = sorted(set(sample + extra), key=lambda v: (str(type(v)), v))


def _items(exprs):
    """A select list, each item aliased (DataFusion refuses two equal unaliased expressions in
    one projection, see the corpus' unsupported forms)."""
    return ", ".join(f"{e} AS c{i}" for i, e in enumerate(exprs))


class Generator:
    """Seeded random queries over one table. Every generated query has a total ORDER BY (or
    returns one row), so rows are compared in order."""

    def __init__(self, seed, specs):
        self.rng = random.Random(seed)
        self.specs = specs

    def _pick(self, seq, k=None):
        if k is None:
            return self.rng.choice(seq)
        return self.rng.sample(seq, min(k, len(seq)))

    def atom(self, spec):
        r = self.rng
        c = self._pick([c for c in spec.cols if c.filter and (c.values or c.nullable)])
        if not c.values or r.random() < 0.1:
            op = "IS NULL" if r.random() < 0.5 else "IS NOT NULL"
            return f"{c.ll} {op}", f"{c.duck} {op}"
        v = lambda: _lit(c, r.choice(c.values))  # noqa: E731
        shape = r.random()
        if c.kind == "bool":
            if shape < 0.3:
                return c.ll, c.duck
            if shape < 0.5:
                return f"NOT {c.ll}", f"NOT {c.duck}"
            lit = v()
            return f"{c.ll} = {lit}", f"{c.duck} = {lit}"
        if shape < 0.45:
            op = r.choice(["=", "<>", "<", "<=", ">", ">="] if c.kind != "str" or r.random() < 0.5
                          else ["=", "<>"])
            lit = v()
            if r.random() < 0.2:  # literal on the left
                flip = {"<": ">", ">": "<", "<=": ">=", ">=": "<="}.get(op, op)
                return f"{lit} {flip} {c.ll}", f"{lit} {flip} {c.duck}"
            return f"{c.ll} {op} {lit}", f"{c.duck} {op} {lit}"
        if shape < 0.65:
            a, b = sorted([r.choice(c.values), r.choice(c.values)],
                          key=lambda x: (str(type(x)), x))
            neg = "NOT " if r.random() < 0.25 else ""
            return (f"{c.ll} {neg}BETWEEN {_lit(c, a)} AND {_lit(c, b)}",
                    f"{c.duck} {neg}BETWEEN {_lit(c, a)} AND {_lit(c, b)}")
        if shape < 0.85:
            lits = ", ".join(_lit(c, x) for x in self._pick(c.values, r.randint(1, 5)))
            neg = "NOT " if r.random() < 0.3 else ""
            return f"{c.ll} {neg}IN ({lits})", f"{c.duck} {neg}IN ({lits})"
        if c.kind == "str" and r.random() < 0.5:
            s = str(r.choice(c.values))
            pat = "'" + s[: r.randint(0, max(1, len(s) - 1))].replace("'", "''") + "%'"
            return f"{c.ll} LIKE {pat}", f"{c.duck} LIKE {pat}"
        op = "IS NULL" if r.random() < 0.5 else "IS NOT NULL"
        return f"{c.ll} {op}", f"{c.duck} {op}"

    def predicate(self, spec, depth=0):
        r = self.rng
        roll = r.random()
        if depth >= 2 or roll < 0.4:
            return self.atom(spec)
        if roll < 0.85:
            op = "AND" if r.random() < 0.6 else "OR"
            a, b = self.predicate(spec, depth + 1), self.predicate(spec, depth + 1)
            return f"({a[0]} {op} {b[0]})", f"({a[1]} {op} {b[1]})"
        a = self.predicate(spec, depth + 1)
        return f"NOT ({a[0]})", f"NOT ({a[1]})"

    def _where(self, spec):
        if self.rng.random() < 0.1:
            return "", ""
        ll, duck = self.predicate(spec)
        return f" WHERE {ll}", f" WHERE {duck}"

    def _aggs(self, spec):
        r = self.rng
        out = []
        for _ in range(r.randint(1, 4)):
            cands = [c for c in spec.cols if c.agg]
            c = self._pick(cands)
            choices = ["count", "min", "max", "count_distinct"]
            if c.kind in ("int", "float"):
                choices += ["sum", "avg", "sum", "avg"]
            if c.kind == "bool":
                choices = ["count", "bool_and", "bool_or", "count_distinct"]
            f = r.choice(choices)
            if f == "count_distinct":
                out.append((f"count(DISTINCT {c.ll})", f"count(DISTINCT {c.duck})"))
            elif f == "count" and r.random() < 0.3:
                out.append(("count(*)", "count(*)"))
            else:
                out.append((f"{f}({c.ll})", f"{f}({c.duck})"))
        return out

    def query(self, i):
        r = self.rng
        spec = self._pick(self.specs)
        where_ll, where_duck = self._where(spec)
        shape = r.random()
        name = f"gen-{i}"
        if shape < 0.3:
            # Rows: projection, filter, total order (random directions), LIMIT.
            cols = self._pick(spec.cols, r.randint(1, 4))
            lead = self._pick([c for c in spec.cols if c.group], r.randint(0, 2))
            order_ll, order_duck = [], []
            for c in lead:
                d = r.choice(["", " DESC", " ASC NULLS FIRST", " DESC NULLS LAST"])
                order_ll.append(c.ll + d)
                order_duck.append(c.duck + d)
            d = r.choice(["", " DESC"])
            order_ll += [u + d for u in spec.unique]
            order_duck += [u + d for u in spec.unique]
            limit = f" LIMIT {r.choice([1, 5, 17, 100, 1000])}" if r.random() < 0.7 else ""
            offset = f" OFFSET {r.choice([0, 3, 50])}" if limit and r.random() < 0.2 else ""
            ll = (f"SELECT {_items(c.ll for c in cols)} FROM {spec.name}{where_ll} "
                  f"ORDER BY {', '.join(order_ll)}{limit}{offset}")
            duck = (f"SELECT {_items(c.duck for c in cols)} FROM {spec.name}{where_duck} "
                    f"ORDER BY {', '.join(order_duck)}{limit}{offset}")
            return Query(name, ll, duck, ordered=True)
        if shape < 0.5:
            aggs = [("count(*)", "count(*)")] + self._aggs(spec)
            ll = f"SELECT {_items(a for a, _ in aggs)} FROM {spec.name}{where_ll}"
            duck = f"SELECT {_items(b for _, b in aggs)} FROM {spec.name}{where_duck}"
            return Query(name, ll, duck, ordered=True)
        if shape < 0.85:
            keys = self._pick([c for c in spec.cols if c.group], r.randint(1, 3))
            aggs = self._aggs(spec)
            having_ll = having_duck = ""
            if r.random() < 0.25:
                n = r.choice([1, 2, 5, 20])
                having_ll = having_duck = f" HAVING count(*) > {n}"
            order = [str(k + 1) + r.choice(["", " DESC"]) for k in range(len(keys))]
            limit = f" LIMIT {r.choice([3, 10, 50])}" if r.random() < 0.4 else ""
            ll = (f"SELECT {_items([k.ll for k in keys] + [a for a, _ in aggs])} "
                  f"FROM {spec.name}{where_ll} "
                  f"GROUP BY {', '.join(k.ll for k in keys)}{having_ll} "
                  f"ORDER BY {', '.join(order)}{limit}")
            duck = (f"SELECT {_items([k.duck for k in keys] + [b for _, b in aggs])} "
                    f"FROM {spec.name}{where_duck} "
                    f"GROUP BY {', '.join(k.duck for k in keys)}{having_duck} "
                    f"ORDER BY {', '.join(order)}{limit}")
            return Query(name, ll, duck, ordered=True)
        # SELECT DISTINCT over a few columns, ordered by all of them.
        keys = self._pick([c for c in spec.cols if c.group], r.randint(1, 3))
        order = ", ".join(str(k + 1) for k in range(len(keys)))
        ll = (f"SELECT DISTINCT {', '.join(k.ll for k in keys)} FROM {spec.name}{where_ll} "
              f"ORDER BY {order}")
        duck = (f"SELECT DISTINCT {', '.join(k.duck for k in keys)} FROM {spec.name}"
                f"{where_duck} ORDER BY {order}")
        return Query(name, ll, duck, ordered=True)
