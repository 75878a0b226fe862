//! Insert: a new notice row, written through the caller's connection
//! (normally its business transaction) so it commits with the business data
//! or not at all.
//!
//! The row is checked before any SQL (`check`): text the database would
//! refuse (a NUL character, an over-long key, a param over the size limit)
//! is a typed error that leaves the caller's transaction untouched. On
//! PostgreSQL, where any failed statement aborts the whole transaction, an
//! insert into a transaction the caller began ([`Notifier::wrap`]) runs
//! inside a `SAVEPOINT`, so a database error rolls back only the notice;
//! MySQL/MariaDB and SQLite roll back a failed statement on their own. A
//! [`Notifier::begin`] transaction on PostgreSQL buffers its notices and
//! writes them with the `COMMIT`: a database error there fails the commit
//! (`Error::TransactionAborted`), and nothing is committed. (It writes them
//! at once instead when they have a key, or once a savepoint may exist:
//! see [`producer`](crate::producer).)
//!
//! [`Notifier::wrap`]: crate::Notifier::wrap
//! [`Notifier::begin`]: crate::Notifier::begin

use sea_orm::{
    ConnectionTrait, DbBackend, DbErr,
    sea_query::{Expr, InsertStatement, IntoIden, Query},
};

use super::{
    clock::{self, Due},
    columns::{self, Column},
};
use crate::{entity::notify_msg, status::Origin};

/// Longest `idempotency_key`, in characters (the column is `varchar(255)`).
pub const MAX_KEY_CHARS: usize = 255;
/// Default largest `param`, in bytes: 1 MiB. See
/// [`Config::max_param_bytes`](crate::Config::max_param_bytes).
pub const DEFAULT_MAX_PARAM_BYTES: usize = 1024 * 1024;

/// A notice row to insert. A row reserved for its producer's after-commit
/// attempt is written `leased` at version 0: the reservation is that
/// attempt's claim, from the database's clock, so the attempt needs no claim
/// of its own.
#[derive(Debug, Clone)]
pub(crate) struct NewRow {
    pub def_id: i64,
    pub param: String,
    pub description: String,
    pub load_balance_num: i32,
    pub idempotency_key: Option<String>,
    pub target_override: Option<String>,
    /// The producer's trace context ([`crate::trace`]).
    pub trace_context: Option<String>,
    /// Orders it after older notices of its definition with this key.
    pub ordering_key: Option<String>,
    pub due: Due,
    /// Who writes it: a producer, or the library itself.
    pub origin: Origin,
}

impl NewRow {
    /// A notice the library writes itself (`origin`: an alert, an
    /// operational event) for definition `def_id`: due now, no key, no
    /// partition, the current trace context.
    pub(crate) fn follow_up(
        origin: Origin,
        def_id: i64,
        param: String,
        description: String,
    ) -> NewRow {
        NewRow {
            def_id,
            param,
            description,
            load_balance_num: 0,
            idempotency_key: None,
            target_override: None,
            trace_context: crate::trace::capture(),
            ordering_key: None,
            due: Due::Now,
            origin,
        }
    }
}

/// Why a row cannot be stored, found before any SQL runs.
pub(crate) fn check(row: &NewRow, max_param_bytes: usize) -> Result<(), String> {
    let nul = |field: &str, text: &str| {
        if text.contains('\0') {
            Err(format!(
                "{field} contains a NUL character, which databases refuse"
            ))
        } else {
            Ok(())
        }
    };
    nul("description", &row.description)?;
    nul("param", &row.param)?;
    if row.param.len() > max_param_bytes {
        return Err(format!(
            "param is {} bytes, over the limit of {max_param_bytes} (Config::max_param_bytes)",
            row.param.len()
        ));
    }
    if row.description.len() > max_param_bytes {
        return Err(format!(
            "description is {} bytes, over the limit of {max_param_bytes} (Config::max_param_bytes)",
            row.description.len()
        ));
    }
    for (field, key) in [
        ("idempotency_key", &row.idempotency_key),
        ("ordering_key", &row.ordering_key),
    ] {
        let Some(key) = key else { continue };
        nul(field, key)?;
        let chars = key.chars().count();
        if chars > MAX_KEY_CHARS {
            return Err(format!(
                "{field} is {chars} characters, over the limit of {MAX_KEY_CHARS}"
            ));
        }
    }
    if let Some(over) = &row.target_override {
        nul("target_override", over)?;
    }
    if let Some(trace) = &row.trace_context {
        nul("trace_context", trace)?;
    }
    if row.load_balance_num < 0 {
        return Err("load_balance_num must not be negative".into());
    }
    Ok(())
}

/// Where a caller's insert must land.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Within {
    /// Any connection, in a transaction or in autocommit.
    Any,
    /// An open transaction. On MySQL/MariaDB the statement checks
    /// `@@in_transaction`: a transaction the server rolled back (a deadlock
    /// victim) leaves the connection in autocommit, where an insert would
    /// commit on its own; it writes nothing instead
    /// ([`InsertError::NoTransaction`]). Elsewhere an aborted transaction
    /// refuses the statement (PostgreSQL) or the library saw the failure
    /// that ended it.
    Transaction,
}

/// Why an insert wrote nothing.
#[derive(Debug)]
pub(crate) enum InsertError {
    /// The database refused it. `aborted`: the caller's transaction cannot
    /// go on (it was aborted already, or the savepoint around the insert
    /// could not be rolled back).
    Db { error: DbErr, aborted: bool },
    /// The caller's transaction was no longer open ([`Within::Transaction`]).
    NoTransaction,
}

impl From<DbErr> for InsertError {
    fn from(error: DbErr) -> Self {
        let aborted = crate::db::in_aborted_transaction(&error);
        InsertError::Db { error, aborted }
    }
}

/// Where a new row's column gets its value.
#[derive(Debug, Clone, Copy)]
enum Init {
    DefId,
    Param,
    Description,
    LoadBalanceNum,
    IdempotencyKey,
    TargetOverride,
    TraceContext,
    OrderingKey,
    /// `next_call_time`: now, or one lease ahead for a reservation.
    Due,
    /// Whether it is reserved for its after-commit attempt.
    Reserved,
    /// The database's time of the insert ([`clock::insert_time`]).
    Now,
    /// `not_before`: a delayed notice's due time, else NULL.
    NotBefore,
    /// `errors`: empty.
    Empty,
    /// `status`, `retry_times`, `version`: 0.
    Zero,
    /// Who writes it.
    Origin,
}

/// The one layout of a new notice row: every column written at insert (all
/// but `id`, given by the database or the caller, `last_call_time`, NULL
/// until a first call, and `step` and `step_result`, 0 and NULL until a
/// first step succeeds).
const NEW_ROW: [(Column, Init); 17] = [
    (Column::DefId, Init::DefId),
    (Column::Param, Init::Param),
    (Column::Description, Init::Description),
    (Column::Errors, Init::Empty),
    (Column::Status, Init::Zero),
    (Column::RetryTimes, Init::Zero),
    (Column::NextCallTime, Init::Due),
    (Column::CreateTime, Init::Now),
    (Column::Version, Init::Zero),
    (Column::LoadBalanceNum, Init::LoadBalanceNum),
    (Column::IdempotencyKey, Init::IdempotencyKey),
    (Column::TargetOverride, Init::TargetOverride),
    (Column::Leased, Init::Reserved),
    (Column::TraceContext, Init::TraceContext),
    (Column::OrderingKey, Init::OrderingKey),
    (Column::NotBefore, Init::NotBefore),
    (Column::Origin, Init::Origin),
];

pub(super) fn statement(backend: DbBackend, row: &NewRow, within: Within) -> InsertStatement {
    // PostgreSQL's `due_at` (migration 16), with the very expression of
    // `next_call_time` ([`Init::Due`]), so the trigger that would copy it
    // is not called.
    let pg = backend == DbBackend::Postgres;
    let mut insert = Query::insert();
    insert.into_table(notify_msg::Entity).columns(
        NEW_ROW
            .map(|(c, _)| c.into_iden())
            .into_iter()
            .chain(pg.then(|| columns::due_at().into_iden())),
    );
    let values = values(backend, row)
        .into_iter()
        .chain(pg.then(|| row.due.expr(backend)));
    if backend == DbBackend::MySql && within == Within::Transaction {
        // `INSERT … SELECT … WHERE @@in_transaction = 1`: no row outside
        // a transaction. (`select_from` refuses only unequal counts of
        // columns and values, which are equal by construction.)
        let mut select = Query::select();
        select
            .exprs(values)
            .and_where(Expr::cust("@@in_transaction = 1"));
        insert.select_from(select).ok();
        return insert;
    }
    insert.values_panic(values);
    insert
}

/// The values of `row`, in the order of [`NEW_ROW`].
fn values(backend: DbBackend, row: &NewRow) -> [Expr; 17] {
    let value = |init: Init| -> Expr {
        match init {
            Init::DefId => row.def_id.into(),
            Init::Param => row.param.clone().into(),
            Init::Description => row.description.clone().into(),
            Init::LoadBalanceNum => row.load_balance_num.into(),
            Init::IdempotencyKey => row.idempotency_key.clone().into(),
            Init::TargetOverride => row.target_override.clone().into(),
            Init::TraceContext => row.trace_context.clone().into(),
            Init::OrderingKey => row.ordering_key.clone().into(),
            Init::Due => row.due.expr(backend),
            Init::Reserved => row.due.reserved().into(),
            Init::NotBefore => row.due.not_before(backend),
            Init::Now => clock::insert_time(backend),
            Init::Empty => "".into(),
            Init::Zero => 0.into(),
            Init::Origin => sea_orm::ActiveEnum::to_value(&row.origin).into(),
        }
    };
    NEW_ROW.map(|(_, init)| value(init))
}

/// Largest statement of buffered notices sent as SQL literals with their
/// `COMMIT` ([`pg_insert_literal`]), estimated from the text's size plus
/// [`LITERAL_ROW_BYTES`] a row; larger batches go as a prepared statement
/// ([`pg_insert_rows`]) before it: 1 MiB.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))] // PostgreSQL's alone
pub(crate) const LITERAL_INSERT_MAX_BYTES: usize = 1024 * 1024;

/// SQL text of one literal row besides its strings (an upper bound).
#[cfg_attr(not(feature = "postgres"), allow(dead_code))] // PostgreSQL's alone
const LITERAL_ROW_BYTES: usize = 512;

/// PostgreSQL: buffered rows (ids handed out beforehand) as one `INSERT`
/// whose values are SQL literals, for a simple-protocol message that also
/// carries the `COMMIT`. `None` when the statement would be larger than
/// [`LITERAL_INSERT_MAX_BYTES`].
///
/// Strings are dollar-quoted with a tag they do not contain
/// ([`dollar_quote`]): the server's lexer takes everything up to that tag
/// verbatim, whatever `standard_conforming_strings`, `backslash_quote` or a
/// multibyte `client_encoding` say (no escaping is involved). The rows passed
/// [`check`] (no NUL).
#[cfg_attr(not(feature = "postgres"), allow(dead_code))] // PostgreSQL's alone
pub(crate) fn pg_insert_literal(rows: &[(i64, NewRow)]) -> Option<String> {
    let text = |r: &NewRow| {
        r.param.len()
            + r.description.len()
            + r.target_override.as_ref().map_or(0, String::len)
            + r.idempotency_key.as_ref().map_or(0, String::len)
            + r.trace_context.as_ref().map_or(0, String::len)
            + r.ordering_key.as_ref().map_or(0, String::len)
    };
    let size: usize = rows.iter().map(|(_, r)| text(r) + LITERAL_ROW_BYTES).sum();
    if rows.is_empty() || size > LITERAL_INSERT_MAX_BYTES {
        return None;
    }
    let quoted = |s: &str| Expr::cust(dollar_quote(s));
    let mut insert = Query::insert();
    insert.into_table(notify_msg::Entity).columns(
        std::iter::once(Column::Id.into_iden())
            .chain(NEW_ROW.map(|(c, _)| c.into_iden()))
            .chain([columns::due_at().into_iden()]),
    );
    for (id, row) in rows {
        let mut values = values(DbBackend::Postgres, row);
        for ((_, init), value) in NEW_ROW.iter().zip(values.iter_mut()) {
            let text = match init {
                Init::Param => Some(row.param.as_str()),
                Init::Description => Some(row.description.as_str()),
                Init::IdempotencyKey => row.idempotency_key.as_deref(),
                Init::TargetOverride => row.target_override.as_deref(),
                Init::TraceContext => row.trace_context.as_deref(),
                Init::OrderingKey => row.ordering_key.as_deref(),
                _ => continue,
            };
            if let Some(text) = text {
                *value = quoted(text);
            }
        }
        let due = row.due.expr(DbBackend::Postgres);
        insert.values_panic(std::iter::once(Expr::val(*id)).chain(values).chain([due]));
    }
    Some(insert.to_string(sea_orm::sea_query::PostgresQueryBuilder))
}

/// `s` as a PostgreSQL dollar-quoted string, `$sn$…$sn$` with a tag whose
/// first occurrence after the opening one is the closing one: `$snN$` with
/// the smallest `N` (none for 0) that `s` does not hold and whose closing
/// tag does not run into the end of `s` (`…$sn` + `$sn$`). One pass over
/// `s` finds the numbers it holds, so the cost is linear whatever `s` is.
/// `$` is never the trail byte of a multibyte character in any encoding
/// PostgreSQL accepts from a client, so a tag cannot hide inside one.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))] // PostgreSQL's alone
fn dollar_quote(s: &str) -> String {
    let held: std::collections::HashSet<u64> = s
        .match_indices("$sn")
        .filter_map(|(at, _)| {
            let rest = &s[at + 3..];
            let digits = rest.find(|c: char| !c.is_ascii_digit())?;
            if !rest[digits..].starts_with('$') {
                return None;
            }
            match &rest[..digits] {
                "" => Some(0),
                n => n.parse().ok(),
            }
        })
        .collect();
    let mut n = 0u64;
    loop {
        if !held.contains(&n) {
            let tag = match n {
                0 => "$sn$".to_string(),
                n => format!("$sn{n}$"),
            };
            // The closing tag is the first one unless it runs into the end
            // of `s`, which only the last few bytes can do.
            let tail_from = s.len().saturating_sub(tag.len());
            let tail_from = (tail_from..=s.len())
                .find(|&i| s.is_char_boundary(i))
                .unwrap_or(s.len());
            let joined = format!("{}{tag}", &s[tail_from..]);
            if joined.find(tag.as_str()) == Some(s.len() - tail_from) {
                return format!("{tag}{s}{tag}");
            }
        }
        n += 1;
    }
}

/// Inserts `rows` on `conn` (a transaction), in order: their ids.
pub(crate) async fn insert_all<C: sea_orm::ConnectionTrait>(
    conn: &C,
    rows: &[NewRow],
) -> Result<Vec<i64>, DbErr> {
    let mut ids = Vec::with_capacity(rows.len());
    for row in rows {
        ids.push(insert_plain(conn, row).await?);
    }
    Ok(ids)
}

/// Inserts `row` inside one of solid-notify's own transactions (no
/// savepoint: the transaction is rolled back whole on error).
pub(crate) async fn insert_plain<C: ConnectionTrait>(conn: &C, row: &NewRow) -> Result<i64, DbErr> {
    match insert_new(conn, row, Within::Any).await {
        Ok(id) => Ok(id),
        Err(InsertError::Db { error, .. }) => Err(error),
        Err(InsertError::NoTransaction) => Err(DbErr::RecordNotInserted),
    }
}

/// Inserts `row` without a key check; its id.
pub(crate) async fn insert_new<C: ConnectionTrait>(
    conn: &C,
    row: &NewRow,
    within: Within,
) -> Result<i64, InsertError> {
    let backend = conn.get_database_backend();
    let mut stmt = statement(backend, row, within);
    if backend == DbBackend::Postgres {
        stmt.returning_col(Column::Id);
        return Ok(conn
            .query_one(&stmt)
            .await?
            .ok_or(DbErr::UnpackInsertId)?
            .try_get_by_index::<i64>(0)?);
    }
    let done = conn.execute(&stmt).await?;
    if done.rows_affected() == 0 {
        return Err(InsertError::NoTransaction);
    }
    Ok(i64::try_from(done.last_insert_id()).map_err(|_| DbErr::UnpackInsertId)?)
}

/// [`pg_insert_rows`]'s statement.
#[cfg(feature = "postgres")]
fn pg_insert_sql() -> String {
    use sea_orm::IdenStatic;
    let now = "(statement_timestamp() AT TIME ZONE 'UTC')";
    // A delayed notice's time (`r.at`), or `r.due` seconds from now.
    let due = format!("COALESCE(r.at, {now} + make_interval(secs => r.due))");
    // Its `next_call_time`: the same, but a time already past is now,
    // above the claims' floor (`GREATEST` would take now for a NULL).
    let next = format!(
        "CASE WHEN r.at IS NULL THEN {now} + make_interval(secs => r.due) \
         ELSE GREATEST(r.at, {now}) END"
    );
    let values = NEW_ROW.map(|(_, init)| match init {
        Init::DefId => "r.def_id".to_string(),
        Init::Param => "r.param".into(),
        Init::Description => "r.description".into(),
        Init::LoadBalanceNum => "r.lb".into(),
        Init::IdempotencyKey => "r.key".into(),
        Init::TargetOverride => "r.over".into(),
        Init::TraceContext => "r.trace".into(),
        Init::OrderingKey => "r.ordering".into(),
        Init::Due => next.clone(),
        Init::Reserved => "r.reserved".into(),
        Init::NotBefore => format!("CASE WHEN r.later THEN {due} END"),
        Init::Now => clock::PG_INSERT_TIME.into(),
        Init::Empty => "''".into(),
        Init::Zero => "0".into(),
        Init::Origin => "r.origin".into(),
    });
    // `due_at` (migration 16) as `next_call_time`: no trigger call.
    format!(
        "INSERT INTO notify_msg (id, {}, due_at) SELECT r.id, {}, {next} \
         FROM UNNEST($1::bigint[], $2::bigint[], $3::text[], $4::text[], $5::int[], \
         $6::text[], $7::text[], $8::float8[], $9::bool[], $10::text[], $11::text[], \
         $12::timestamp[], $13::bool[], $14::smallint[]) \
         AS r(id, def_id, param, description, lb, key, over, due, reserved, trace, ordering, \
         at, later, origin)",
        NEW_ROW.map(|(c, _)| c.as_str()).join(", "),
        values.join(", ")
    )
}

/// PostgreSQL: writes buffered rows (ids handed out beforehand from
/// [`IdBlocks`](super::ids::IdBlocks)) in one prepared statement, whatever
/// their number: `INSERT … SELECT … FROM UNNEST($1::bigint[], …)`. Planned
/// once per connection; every value is a bound parameter. Inside the
/// caller's transaction, or alone (then it commits by itself).
#[cfg(feature = "postgres")]
pub(crate) async fn pg_insert_rows(
    conn: &mut sea_orm::sqlx::PgConnection,
    rows: &[(i64, NewRow)],
) -> Result<(), sea_orm::sqlx::Error> {
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let sql = SQL.get_or_init(pg_insert_sql);
    use super::clock::Later;
    let due = |row: &NewRow| match row.due {
        Due::Now | Due::InTurn | Due::Later(Later::At(_)) => 0.0,
        Due::Reserved(d) | Due::Later(Later::By(d)) => d.as_secs_f64(),
    };
    let at = |row: &NewRow| match row.due {
        Due::Later(Later::At(t)) => Some(t),
        _ => None,
    };
    sea_orm::sqlx::query(sea_orm::sqlx::AssertSqlSafe(sql.as_str()))
        .bind(rows.iter().map(|(id, _)| *id).collect::<Vec<i64>>())
        .bind(rows.iter().map(|(_, r)| r.def_id).collect::<Vec<i64>>())
        .bind(
            rows.iter()
                .map(|(_, r)| r.param.clone())
                .collect::<Vec<String>>(),
        )
        .bind(
            rows.iter()
                .map(|(_, r)| r.description.clone())
                .collect::<Vec<String>>(),
        )
        .bind(
            rows.iter()
                .map(|(_, r)| r.load_balance_num)
                .collect::<Vec<i32>>(),
        )
        .bind(
            rows.iter()
                .map(|(_, r)| r.idempotency_key.clone())
                .collect::<Vec<Option<String>>>(),
        )
        .bind(
            rows.iter()
                .map(|(_, r)| r.target_override.clone())
                .collect::<Vec<Option<String>>>(),
        )
        .bind(rows.iter().map(|(_, r)| due(r)).collect::<Vec<f64>>())
        .bind(
            rows.iter()
                .map(|(_, r)| r.due.reserved())
                .collect::<Vec<bool>>(),
        )
        .bind(
            rows.iter()
                .map(|(_, r)| r.trace_context.clone())
                .collect::<Vec<Option<String>>>(),
        )
        .bind(
            rows.iter()
                .map(|(_, r)| r.ordering_key.clone())
                .collect::<Vec<Option<String>>>(),
        )
        .bind(
            rows.iter()
                .map(|(_, r)| at(r))
                .collect::<Vec<Option<chrono::NaiveDateTime>>>(),
        )
        .bind(
            rows.iter()
                .map(|(_, r)| matches!(r.due, Due::Later(_)))
                .collect::<Vec<bool>>(),
        )
        .bind(
            rows.iter()
                .map(|(_, r)| sea_orm::ActiveEnum::to_value(&r.origin))
                .collect::<Vec<i16>>(),
        )
        .execute(conn)
        .await
        .map(drop)
}

#[cfg(test)]
mod tests {
    use sea_orm::IdenStatic;

    use super::*;

    fn row() -> NewRow {
        NewRow {
            def_id: 1,
            param: "{}".into(),
            description: String::new(),
            load_balance_num: 0,
            idempotency_key: None,
            target_override: None,
            trace_context: None,
            ordering_key: None,
            due: Due::Now,
            origin: Origin::Producer,
        }
    }

    #[test]
    fn new_rows_write_every_column_but_id_last_call_time_and_step() {
        use sea_orm::Iterable;
        let written: Vec<_> = NEW_ROW.iter().map(|(c, _)| c.as_str()).collect();
        for c in Column::iter() {
            // A new notice is on its first step, with no result passed on:
            // the columns' defaults (0, NULL).
            let expected = !matches!(
                c,
                Column::Id | Column::LastCallTime | Column::Step | Column::StepResult
            );
            assert_eq!(written.contains(&c.as_str()), expected, "{}", c.as_str());
        }
    }

    #[test]
    fn literal_inserts_quote_every_string_verbatim() {
        let nasty = NewRow {
            param: r#"{"a":"it's \ done"}"#.into(),
            description: "line\nnext'; DROP TABLE notify_msg; --".into(),
            idempotency_key: Some("k'\\$sn$".into()),
            trace_context: Some(r#"{"traceparent":"a'b"}"#.into()),
            ordering_key: Some("o'k".into()),
            due: Due::Reserved(std::time::Duration::from_millis(1500)),
            ..row()
        };
        let sql = pg_insert_literal(&[(7, nasty), (8, row())]).unwrap();
        assert!(
            sql.starts_with(r#"INSERT INTO "notify_msg" ("id", "def_id""#),
            "{sql}"
        );
        assert!(sql.contains(r#"$sn${"a":"it's \ done"}$sn$"#), "{sql}");
        assert!(
            sql.contains("$sn$line\nnext'; DROP TABLE notify_msg; --$sn$"),
            "{sql}"
        );
        assert!(sql.contains(r"$sn1$k'\$sn$$sn1$"), "{sql}");
        assert!(sql.contains("make_interval(secs => 1.5)"), "{sql}");
        assert!(
            sql.contains(
                r#"TRUE, $sn${"traceparent":"a'b"}$sn$, $sn$o'k$sn$, NULL, 0, ((statement_timestamp() AT TIME ZONE 'UTC') + make_interval(secs => 1.5))), (8, 1, "#
            ),
            "two rows, the trace context quoted, due_at last as next_call_time: {sql}"
        );
        assert!(
            sql.contains(r#""ordering_key", "not_before", "origin", "due_at") VALUES"#),
            "{sql}"
        );
        // Many small rows count their SQL, not only their text.
        let many: Vec<_> = (0..10_000).map(|id| (id, row())).collect();
        assert!(pg_insert_literal(&many).is_none());
        let big = NewRow {
            param: "x".repeat(LITERAL_INSERT_MAX_BYTES + 1),
            ..row()
        };
        assert!(pg_insert_literal(&[(1, big)]).is_none());
    }

    #[test]
    fn dollar_quotes_end_only_at_their_end() {
        let many: String = (0..2000).rev().map(|n| format!("$sn{n}$")).collect();
        let many = many.replacen("$sn0$", "$sn$", 1);
        for s in [
            "",
            "$",
            "$sn",
            "a$sn",
            "$sn$",
            "x$sn$y$sn1$",
            "$sn1",
            "s$",
            "$sn$$sn1$$sn",
            "ü$sn",
            many.as_str(),
        ] {
            let quoted = dollar_quote(s);
            let tag_len = quoted
                .find('$')
                .map(|i| quoted[i + 1..].find('$').unwrap() + 2)
                .unwrap();
            let (tag, rest) = quoted.split_at(tag_len);
            assert_eq!(rest.find(tag), Some(s.len()), "{s:?} as {quoted}");
            assert_eq!(&rest[..s.len()], s);
        }
    }

    #[test]
    fn checks_before_sql() {
        assert!(check(&row(), 10).is_ok());
        let nul = NewRow {
            description: "a\0b".into(),
            ..row()
        };
        assert!(check(&nul, 10).unwrap_err().contains("description"));
        let big = NewRow {
            param: format!("\"{}\"", "x".repeat(20)),
            ..row()
        };
        assert!(check(&big, 10).unwrap_err().contains("over the limit"));
        // 255 characters of 2 bytes each is fine: the limit is in characters.
        let key = NewRow {
            idempotency_key: Some("é".repeat(255)),
            ..row()
        };
        assert!(check(&key, 10).is_ok());
        let long = NewRow {
            idempotency_key: Some("é".repeat(256)),
            ..row()
        };
        assert!(check(&long, 10).unwrap_err().contains("256 characters"));
        let key_nul = NewRow {
            idempotency_key: Some("k\0".into()),
            ..row()
        };
        assert!(check(&key_nul, 10).is_err());
    }
}
