//! Pins: the notices a bulk confirmation counted ([`Pinned`]), kept in the
//! dashboard's memory under a random token until the operator confirms, so
//! that the action changes exactly what was shown, or fewer.
//!
//! A pin is used once, by the user who counted it, and lives at most
//! [`PIN_TTL`]. At most [`MAX_PINS`]
//! are kept, holding at most [`MAX_PINNED_TOTAL`] notices in all; a new pin
//! drops the oldest ones beyond those bounds. A confirmation whose pin is
//! gone (used, expired, dropped, or the dashboard restarted) is refused:
//! count again. The pins are this process's: behind several dashboard
//! processes, a confirmation must reach the one that counted.

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

use crate::ops::bulk::Pinned;

/// How long a confirmation's pin is kept: 15 minutes.
pub const PIN_TTL: Duration = Duration::from_secs(15 * 60);

/// Most pins kept at once: 64.
pub const MAX_PINS: usize = 64;

/// Most notices all pins hold together: 1,000,000 (16 MB).
pub const MAX_PINNED_TOTAL: usize = 1_000_000;

struct Entry {
    pinned: Pinned,
    created: Instant,
    /// Who counted: only they may confirm.
    actor: String,
}

/// The live pins, by token.
#[derive(Default)]
pub(super) struct Pins {
    entries: Mutex<HashMap<String, Entry>>,
}

impl Pins {
    /// Keeps `pinned`, counted by `actor`; its token, or `None` when no
    /// random token could be made.
    pub fn put(&self, pinned: Pinned, actor: &str) -> Option<String> {
        let token = super::csrf::fresh()?;
        let mut entries = self.lock();
        entries.retain(|_, e| e.created.elapsed() < PIN_TTL);
        let mut held: usize = entries.values().map(|e| e.pinned.len()).sum();
        while !entries.is_empty()
            && (entries.len() >= MAX_PINS || held + pinned.len() > MAX_PINNED_TOTAL)
        {
            let Some(oldest) = entries
                .iter()
                .min_by_key(|(_, e)| e.created)
                .map(|(t, _)| t.clone())
            else {
                break;
            };
            if let Some(e) = entries.remove(&oldest) {
                held -= e.pinned.len();
            }
        }
        entries.insert(
            token.clone(),
            Entry {
                pinned,
                created: Instant::now(),
                actor: actor.to_string(),
            },
        );
        Some(token)
    }

    /// Takes the pin of `token` (once), if it is still live and `actor`
    /// counted it.
    pub fn take(&self, token: &str, actor: &str) -> Option<Pinned> {
        let mut entries = self.lock();
        if entries.get(token).is_none_or(|e| e.actor != actor) {
            return None;
        }
        let entry = entries.remove(token)?;
        (entry.created.elapsed() < PIN_TTL).then_some(entry.pinned)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.entries
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
