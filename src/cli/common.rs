//! What several commands share: the notice filters and paging flags, the
//! default actor, JSON output and the stop signal.

use std::time::Duration;

use solid_notify::{
    Status,
    ops::{NoticeFilter, Page, When},
};

/// Filters shared by list, history list, requeue and cancel.
#[derive(clap::Args, Clone, Default)]
pub(crate) struct FilterArgs {
    /// Only this definition.
    #[arg(long)]
    def: Option<String>,
    /// Only this status (not_sent, failed, awaiting_confirm in flight;
    /// succeeded, final_failure, cancelled, parked in history).
    #[arg(long, value_parser = parse_status)]
    status: Option<Status>,
    /// Only notices with at least one failed attempt.
    #[arg(long)]
    failing: bool,
    /// Only notices due before this time (UTC, or a duration meaning that
    /// long ago).
    #[arg(long, value_parser = parse_time)]
    due_before: Option<When>,
    /// Only notices created more than this long ago (e.g. 1h).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub(crate) older_than: Option<Duration>,
    /// Only this load_balance_num partition.
    #[arg(long)]
    partition: Option<i32>,
    /// Only notices whose param contains this text.
    #[arg(long)]
    param_contains: Option<String>,
}

/// History's time range (also accepted by requeue).
#[derive(clap::Args, Clone, Default)]
pub(crate) struct RangeArgs {
    /// Finished at or after this time (UTC, or a duration meaning that long ago).
    #[arg(long, value_parser = parse_time)]
    since: Option<When>,
    /// Finished before this time (UTC, or a duration meaning that long ago).
    #[arg(long, value_parser = parse_time)]
    until: Option<When>,
}

#[derive(clap::Args, Clone)]
pub(crate) struct PageArgs {
    /// At most this many rows.
    #[arg(long, default_value_t = 50)]
    limit: u64,
    /// Only ids below this one (the last id of the previous page).
    #[arg(long)]
    before_id: Option<i64>,
    /// Print JSON (one array).
    #[arg(long)]
    pub(crate) json: bool,
}

pub(crate) fn parse_time(text: &str) -> Result<When, String> {
    When::parse(text)
}

fn parse_status(text: &str) -> Result<Status, String> {
    Status::parse(text).ok_or_else(|| {
        format!(
            "`{text}` is not not_sent, failed, awaiting_confirm, succeeded, final_failure, cancelled or parked"
        )
    })
}

impl FilterArgs {
    pub(crate) fn filter(&self, range: Option<&RangeArgs>) -> NoticeFilter {
        NoticeFilter {
            def: self.def.clone(),
            status: self.status,
            failing: self.failing,
            due_before: self.due_before.map(When::ago),
            older_than: self.older_than,
            partition: self.partition,
            param_contains: self.param_contains.clone(),
            since: range.and_then(|r| r.since).map(When::ago),
            until: range.and_then(|r| r.until).map(When::ago),
            ids: None,
            key: None,
        }
    }
}

impl PageArgs {
    pub(crate) fn page(&self) -> Page {
        Page {
            before_id: self.before_id,
            limit: self.limit,
        }
    }
}

/// `$USER`, else `unknown`.
pub(crate) fn default_actor() -> String {
    std::env::var("USER")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

pub(crate) fn print_json(value: &serde_json::Result<serde_json::Value>) {
    match value.as_ref().map(serde_json::to_string_pretty) {
        Ok(Ok(text)) => println!("{text}"),
        Ok(Err(e)) => eprintln!("error: cannot print JSON: {e}"),
        Err(e) => eprintln!("error: cannot print JSON: {e}"),
    }
}

/// Resolves when SIGINT or SIGTERM arrives.
pub(crate) async fn stop_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                ctrl_c.await.ok();
            }
        }
    }
    #[cfg(not(unix))]
    ctrl_c.await.ok();
}
