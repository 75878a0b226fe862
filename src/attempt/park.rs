//! Park: notices whose definition is unknown, deleted or invalid are moved
//! to history with status 6 and the reason in their failure log, and one
//! alert per definition goes to the alert definition's recipients. Once the
//! definition is fixed, `solid-notify requeue --status parked` brings them back.

use std::collections::BTreeMap;

use tokio_util::sync::CancellationToken;

use crate::{
    AttemptReport, AttemptResult, Error, Notifier,
    alert::{ALERT_DESCRIPTION, AlertMail},
    db::{self, Backoff},
    state::{
        Lease,
        batch::{HeldMany, park_many},
        clock::Due,
        insert::NewRow,
    },
};

/// Parks claimed rows whose definition cannot be used, one transaction and
/// one alert per definition. Rows whose definition turns out fine are
/// released instead.
pub(crate) async fn park(
    notifier: &Notifier,
    leases: Vec<Lease>,
    give_up: &CancellationToken,
) -> Vec<AttemptReport> {
    let inner = &notifier.inner;
    let mut by_def: BTreeMap<i64, Vec<Lease>> = BTreeMap::new();
    for lease in leases {
        by_def.entry(lease.row().def_id).or_default().push(lease);
    }
    let mut reports = Vec::new();
    for (def_id, group) in by_def {
        let reason = match inner.defs.by_id(&inner.store.db, def_id).await {
            Err(Error::UnknownDefId(_)) => format!("definition id {def_id} does not exist"),
            Err(Error::InvalidDef(e)) => format!("definition is invalid: {e}"),
            // Valid after all (it changed meanwhile), or not readable now:
            // nothing to park; due again at once.
            Ok(_) => {
                release(
                    notifier,
                    group,
                    "definition is valid again",
                    give_up,
                    &mut reports,
                )
                .await;
                continue;
            }
            Err(e) => {
                let why = format!("definition cannot be read now ({e})");
                release(notifier, group, &why, give_up, &mut reports).await;
                continue;
            }
        };
        let ids: Vec<i64> = group.iter().map(Lease::id).collect();
        // Parked notices are alerted once; without a way to queue the alert
        // they wait for the next park check.
        let alert = match park_alert(notifier, def_id, &reason, &ids).await {
            Ok(alert) => alert,
            Err(e) => {
                let why = format!("cannot queue the alert about parking them ({e})");
                tracing::error!(def_id, error = %e, "cannot read the alert definition; notices not parked yet");
                release(notifier, group, &why, give_up, &mut reports).await;
                continue;
            }
        };
        let result = match park_all(notifier, group, &reason, alert.as_ref(), give_up).await {
            Ok(parked) => {
                tracing::error!(def_id, n = parked.len(), %reason, "parked notices of an unusable definition");
                AttemptResult::Parked {
                    reason: reason.clone(),
                }
            }
            Err(error) => AttemptResult::Error { error },
        };
        reports.extend(ids.into_iter().map(|notice_id| AttemptReport {
            notice_id,
            result: result.clone(),
        }));
    }
    reports
}

/// Releases leases of notices not parked after all.
async fn release(
    notifier: &Notifier,
    group: Vec<Lease>,
    reason: &str,
    give_up: &CancellationToken,
    reports: &mut Vec<AttemptReport>,
) {
    for lease in group {
        let notice_id = lease.id();
        let result =
            crate::attempt::record::release(notifier, lease, reason.to_string(), give_up).await;
        reports.push(AttemptReport { notice_id, result });
    }
}

/// The alert about parked notices, to the alert definition's recipients
/// (`None`: it has none).
async fn park_alert(
    notifier: &Notifier,
    def_id: i64,
    reason: &str,
    ids: &[i64],
) -> Result<Option<NewRow>, Error> {
    let alert_def = notifier.alert_def().await?;
    if alert_def.alert_emails.is_empty() {
        return Ok(None);
    }
    let mail = AlertMail::parked(alert_def.alert_emails.clone(), def_id, reason, ids);
    Ok(Some(NewRow {
        def_id: alert_def.id,
        param: mail.param().to_string(),
        description: ALERT_DESCRIPTION.to_string(),
        load_balance_num: 0,
        idempotency_key: None,
        target_override: None,
        trace_context: crate::trace::capture(),
        ordering_key: None,
        due: Due::Now,
    }))
}

async fn park_all(
    notifier: &Notifier,
    mut leases: Vec<Lease>,
    reason: &str,
    alert: Option<&NewRow>,
    give_up: &CancellationToken,
) -> std::result::Result<Vec<i64>, String> {
    let store = &notifier.inner.store;
    let mut backoff = Backoff::default();
    loop {
        match park_many(store, leases, reason, notifier.app_now(), alert).await {
            Ok(parked) => return Ok(parked),
            Err(HeldMany {
                leases: held,
                error,
            }) => {
                if !db::is_transient(&error) || !backoff.wait(give_up).await {
                    return Err(format!("cannot park: {error}"));
                }
                leases = held;
            }
        }
    }
}
