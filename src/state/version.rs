//! Version: how the optimistic lock of a notice counts.

/// SQL: the version in column `version` (a name, perhaps qualified) plus
/// one, wrapping from the top of its 32-bit range to the bottom as the
/// code's `wrapping_add` does: a row a plain-SQL producer wrote at the
/// limit still takes a claim, instead of failing every claim that meets it.
pub(crate) fn bumped(version: &str) -> String {
    format!("CASE WHEN {version} < 2147483647 THEN {version} + 1 ELSE -2147483648 END")
}

/// [`bumped`] of `p.version`, for statements written whole.
pub(crate) const P_VERSION_BUMPED: &str =
    "CASE WHEN p.version < 2147483647 THEN p.version + 1 ELSE -2147483648 END";

#[cfg(test)]
mod tests {
    #[test]
    fn the_written_form_is_the_bump() {
        assert_eq!(super::P_VERSION_BUMPED, super::bumped("p.version"));
    }
}
