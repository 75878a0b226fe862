//! The 24-hour chart of a definition: one inline SVG, one bar per hour,
//! successes (green) under final failures (red), scaled to the busiest hour.

use maud::{Markup, html};

use crate::ops::overview::Hour;

const BAR: u32 = 6;
const GAP: u32 = 1;
const HEIGHT: u32 = 28;

/// The chart of `hours` (oldest first).
pub(super) fn hours(hours: &[Hour]) -> Markup {
    let busiest = hours
        .iter()
        .map(|h| h.succeeded + h.failed)
        .max()
        .unwrap_or(0)
        .max(1);
    let scale = |n: i64| -> u32 {
        if n <= 0 {
            0
        } else {
            // At least one pixel for any activity.
            (((n as f64 / busiest as f64) * f64::from(HEIGHT)).round() as u32).clamp(1, HEIGHT)
        }
    };
    let width = hours.len() as u32 * (BAR + GAP);
    let total_ok: i64 = hours.iter().map(|h| h.succeeded).sum();
    let total_failed: i64 = hours.iter().map(|h| h.failed).sum();
    html! {
        svg.chart width=(width) height=(HEIGHT) viewBox={"0 0 " (width) " " (HEIGHT)}
            role="img" aria-label={ "last 24 hours: " (total_ok) " succeeded, " (total_failed) " failed" } {
            @for (i, h) in hours.iter().enumerate() {
                @let x = i as u32 * (BAR + GAP);
                @let ok = scale(h.succeeded);
                @let failed = scale(h.failed).min(HEIGHT - ok.min(HEIGHT));
                g {
                    title { (h.hour.format("%H:00")) " UTC: " (h.succeeded) " succeeded, " (h.failed) " failed" }
                    rect.bg x=(x) y="0" width=(BAR) height=(HEIGHT) {}
                    @if ok > 0 {
                        rect.ok x=(x) y=(HEIGHT - ok) width=(BAR) height=(ok) {}
                    }
                    @if failed > 0 {
                        rect.failed x=(x) y=(HEIGHT - ok - failed) width=(BAR) height=(failed) {}
                    }
                }
            }
        }
    }
}
