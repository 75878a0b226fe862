//! Park: notices whose definition is unknown, deleted or invalid are moved
//! to history with status 6 and the reason in their failure log, and one
//! alert per definition goes to the alert definition's recipients. Once the
//! definition is fixed, `solid-notify requeue --status parked` brings them back.

use std::collections::BTreeMap;

use tokio_util::sync::CancellationToken;

use std::sync::Arc;

use super::engine::Engine;
use crate::{
    alert::{ALERT_DESCRIPTION, AlertMail},
    db::{self, Backoff},
    error::Error,
    report::AttemptReport,
    report::AttemptResult,
    state::{
        Lease,
        batch::{HeldMany, park_many},
        insert::NewRow,
    },
};

/// Parks claimed rows whose definition cannot be used, one transaction and
/// one alert per definition. Rows whose definition turns out fine are
/// released instead.
pub(crate) async fn park(
    engine: &Arc<Engine>,
    leases: Vec<Lease>,
    give_up: &CancellationToken,
) -> Vec<AttemptReport> {
    let mut by_def: BTreeMap<i64, Vec<Lease>> = BTreeMap::new();
    for lease in leases {
        by_def.entry(lease.row().def_id).or_default().push(lease);
    }
    let mut reports = Vec::new();
    for (def_id, group) in by_def {
        let reason = match engine.defs.by_id(&engine.store.db, def_id).await {
            Err(Error::UnknownDefId(_)) => format!("definition id {def_id} does not exist"),
            Err(Error::InvalidDef(e)) => format!("definition is invalid: {e}"),
            // Valid after all (it changed meanwhile), or not readable now:
            // nothing to park; due again at once.
            Ok(_) => {
                release(
                    engine,
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
                release(engine, group, &why, give_up, &mut reports).await;
                continue;
            }
        };
        let ids: Vec<i64> = group.iter().map(Lease::id).collect();
        // Parked notices are alerted once; without a way to queue the alert
        // they wait for the next park check.
        let alert = match park_alert(engine, def_id, &reason, &ids).await {
            Ok(alert) => alert,
            Err(e) => {
                let why = format!("cannot queue the alert about parking them ({e})");
                tracing::error!(def_id, error = %e, "cannot read the alert definition; notices not parked yet");
                release(engine, group, &why, give_up, &mut reports).await;
                continue;
            }
        };
        let result = match park_all(engine, group, &reason, alert.as_ref(), give_up).await {
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

/// Parks the claimed notice `lease` of `def` (usable, but the notice is
/// not: it cannot be opened, or is not what its definition takes), with
/// `reason`, and an alert to the alert
/// definition's recipients at most once per
/// [`PARK_ALERT_EVERY`](super::engine::PARK_ALERT_EVERY) per definition.
pub(crate) async fn park_one(
    engine: &Arc<Engine>,
    def: &crate::def::DefRef,
    lease: Lease,
    reason: String,
    give_up: &CancellationToken,
) -> AttemptResult {
    let ids = [lease.id()];
    let alert = match engine.delivery.park_alert_due(def.id) {
        false => None,
        true => match park_alert(engine, def.id, &reason, &ids).await {
            Ok(alert) => alert,
            Err(e) => {
                let why = format!("cannot queue the alert about parking it ({e})");
                return crate::attempt::record::release(engine, lease, why, give_up).await;
            }
        },
    };
    match park_all(engine, vec![lease], &reason, alert.as_ref(), give_up).await {
        Ok(parked) if parked.is_empty() => AttemptResult::LostClaim,
        Ok(_) => {
            if alert.is_some() {
                engine.delivery.park_alerted(def.id);
            }
            tracing::error!(notice_id = ids[0], def = %def.name, %reason, "parked a notice that cannot be delivered as stored");
            AttemptResult::Parked { reason }
        }
        Err(error) => AttemptResult::Error { error },
    }
}

/// Releases leases of notices not parked after all.
async fn release(
    engine: &Arc<Engine>,
    group: Vec<Lease>,
    reason: &str,
    give_up: &CancellationToken,
    reports: &mut Vec<AttemptReport>,
) {
    for lease in group {
        let notice_id = lease.id();
        let result =
            crate::attempt::record::release(engine, lease, reason.to_string(), give_up).await;
        reports.push(AttemptReport { notice_id, result });
    }
}

/// The alert about parked notices, to the alert definition's recipients
/// (`None`: it has none).
async fn park_alert(
    engine: &Arc<Engine>,
    def_id: i64,
    reason: &str,
    ids: &[i64],
) -> Result<Option<NewRow>, Error> {
    let alert_def = engine.alert_def().await?;
    if alert_def.alert_emails.is_empty() {
        return Ok(None);
    }
    let mail = AlertMail::parked(alert_def.alert_emails.clone(), def_id, reason, ids);
    Ok(Some(NewRow::follow_up(
        crate::status::Origin::Alert,
        alert_def.id,
        mail.param().to_string(),
        ALERT_DESCRIPTION.to_string(),
    )))
}

async fn park_all(
    engine: &Arc<Engine>,
    mut leases: Vec<Lease>,
    reason: &str,
    alert: Option<&NewRow>,
    give_up: &CancellationToken,
) -> std::result::Result<Vec<i64>, String> {
    let store = &engine.store;
    let mut backoff = Backoff::default();
    loop {
        match park_many(store, leases, reason, crate::state::clock::app_now(), alert).await {
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
