//! Crypto: params sealed at rest, for definitions with `encrypt = true`.
//!
//! A producer's param (and each step's result derived from it) is stored
//! sealed with XChaCha20-Poly1305 (the `chacha20poly1305` crate; a random
//! 24-byte nonce per value, so random nonces never repeat in practice), as a
//! small JSON object that names the key it was sealed with:
//!
//! ```json
//! {"sealed":"v1","key":"k2","data":"<base64 of nonce and ciphertext>"}
//! ```
//!
//! The definition's id is bound in as associated data: a sealed param
//! copied onto another definition's row does not open. It is opened only to
//! deliver it. Pages, the API, `show`, alerts and events show that it is
//! encrypted, never its text.
//!
//! [`Keys`] holds the keys by id. The current one seals, every one opens, so
//! a key is rotated by adding a new current key and keeping the old ones
//! until `solid-notify rekey` has sealed every row again with the current
//! one. Keys come from [`Config::keys`](crate::Config) or, by default, from
//! the environment variable [`KEYS_ENV`]: `ID:BASE64,ID:BASE64`, the first
//! being the current key, each key 32 random bytes (`openssl rand -base64
//! 32`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The environment variable [`Keys::from_env`] reads:
/// `SOLID_NOTIFY_KEYS=k2:BASE64,k1:BASE64`, the first one current.
pub const KEYS_ENV: &str = "SOLID_NOTIFY_KEYS";

/// Longest key id: 32 bytes of `A-Z a-z 0-9 _ -`.
pub const MAX_KEY_ID_BYTES: usize = 32;

/// The start of every sealed value, as [`Keys::seal`] writes it.
pub const SEALED_PREFIX: &str = "{\"sealed\":\"v1\",";

/// Why a value cannot be sealed or opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CryptoError {
    /// No current key is configured, so nothing can be sealed.
    #[error("no encryption key is configured (set {KEYS_ENV} or Config::keys)")]
    NoKey,
    /// The value was sealed with a key this process does not have.
    #[error("key `{0}` is not configured here")]
    UnknownKey(String),
    /// The value is not sealed (a plain-SQL producer's row, say).
    #[error("the value is not encrypted")]
    NotSealed,
    /// The sealed value does not open: tampered with, truncated, or
    /// copied from another definition's row.
    #[error(
        "the sealed value does not open with key `{0}` here (a different key under that id, or the value was altered or copied from another definition)"
    )]
    Refused(String),
    /// A key or key id given to [`Keys`] is not usable.
    #[error("invalid encryption key: {0}")]
    BadKey(String),
    /// The crate was built without the `encrypt` feature.
    #[error("encryption is not compiled in (cargo feature `encrypt`)")]
    NotCompiled,
}

/// Encryption keys by id; the current one seals. `Debug` shows the ids,
/// never the keys.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Keys {
    current: Option<String>,
    keys: BTreeMap<String, [u8; 32]>,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keys")
            .field("current", &self.current)
            .field("ids", &self.keys.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// The envelope of a sealed value, fields in the order [`SEALED_PREFIX`]
/// expects.
#[derive(Serialize, Deserialize)]
struct Sealed {
    sealed: String,
    key: String,
    data: String,
}

fn check_id(id: &str) -> Result<(), CryptoError> {
    let fine = !id.is_empty()
        && id.len() <= MAX_KEY_ID_BYTES
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    match fine {
        true => Ok(()),
        false => Err(CryptoError::BadKey(format!(
            "key id `{}` must be 1 to {MAX_KEY_ID_BYTES} of A-Z a-z 0-9 _ -",
            id.escape_debug()
        ))),
    }
}

fn aad(def_id: i64) -> String {
    format!("solid-notify:v1:def:{def_id}")
}

impl Keys {
    /// No keys: nothing can be sealed or opened.
    pub fn new() -> Self {
        Keys::default()
    }

    /// Adds the 32-byte key `key` under `id`; the first key added is the
    /// current one until [`current`](Self::current) says otherwise.
    pub fn with(mut self, id: &str, key: [u8; 32]) -> Result<Self, CryptoError> {
        check_id(id)?;
        if self.current.is_none() {
            self.current = Some(id.to_string());
        }
        self.keys.insert(id.to_string(), key);
        Ok(self)
    }

    /// Makes `id` (already added) the key that seals.
    pub fn current(mut self, id: &str) -> Result<Self, CryptoError> {
        if !self.keys.contains_key(id) {
            return Err(CryptoError::UnknownKey(id.to_string()));
        }
        self.current = Some(id.to_string());
        Ok(self)
    }

    /// The id of the key that seals.
    pub fn current_id(&self) -> Option<&str> {
        self.current.as_deref()
    }

    /// Every key id, sorted.
    pub fn ids(&self) -> Vec<&str> {
        self.keys.keys().map(String::as_str).collect()
    }

    /// Whether a key `id` is here.
    pub fn has(&self, id: &str) -> bool {
        self.keys.contains_key(id)
    }

    /// Keys from text `ID:BASE64,ID:BASE64` (spaces around each allowed),
    /// the first one current; empty text: no keys.
    pub fn parse(text: &str) -> Result<Keys, CryptoError> {
        let mut keys = Keys::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((id, key)) = part.split_once(':') else {
                return Err(CryptoError::BadKey(
                    "each key must be written ID:BASE64".into(),
                ));
            };
            let (id, key) = (id.trim(), decode_key(key.trim())?);
            if keys.has(id) {
                return Err(CryptoError::BadKey(format!("key id `{id}` given twice")));
            }
            keys = keys.with(id, key)?;
        }
        Ok(keys)
    }

    /// Keys from [`KEYS_ENV`] (unset: none).
    pub fn from_env() -> Result<Keys, CryptoError> {
        match std::env::var(KEYS_ENV) {
            Ok(text) => Keys::parse(&text),
            Err(_) => Ok(Keys::new()),
        }
    }

    /// Seals `plain` for definition `def_id` with the current key.
    pub fn seal(&self, plain: &str, def_id: i64) -> Result<String, CryptoError> {
        let id = self.current.as_deref().ok_or(CryptoError::NoKey)?;
        let key = self
            .keys
            .get(id)
            .ok_or_else(|| CryptoError::UnknownKey(id.to_string()))?;
        let data = aead::seal(key, plain.as_bytes(), aad(def_id).as_bytes())?;
        let sealed = Sealed {
            sealed: "v1".into(),
            key: id.to_string(),
            data,
        };
        serde_json::to_string(&sealed).map_err(|e| CryptoError::BadKey(e.to_string()))
    }

    /// Opens `stored`, sealed for definition `def_id`.
    pub fn open(&self, stored: &str, def_id: i64) -> Result<String, CryptoError> {
        let sealed = envelope(stored).ok_or(CryptoError::NotSealed)?;
        let key = self
            .keys
            .get(&sealed.key)
            .ok_or_else(|| CryptoError::UnknownKey(sealed.key.clone()))?;
        let plain = aead::open(key, &sealed.data, aad(def_id).as_bytes())
            .map_err(|_| CryptoError::Refused(sealed.key.clone()))?;
        String::from_utf8(plain).map_err(|_| CryptoError::Refused(sealed.key))
    }

    /// Whether `stored` can be opened here (sealed, with a key here); the
    /// seal itself is checked when it is opened.
    pub fn can_open(&self, stored: &str) -> Result<(), CryptoError> {
        let sealed = envelope(stored).ok_or(CryptoError::NotSealed)?;
        match self.keys.contains_key(&sealed.key) {
            true => Ok(()),
            false => Err(CryptoError::UnknownKey(sealed.key)),
        }
    }
}

fn envelope(stored: &str) -> Option<Sealed> {
    if !stored.starts_with(SEALED_PREFIX) {
        return None;
    }
    serde_json::from_str::<Sealed>(stored)
        .ok()
        .filter(|s| s.sealed == "v1" && check_id(&s.key).is_ok())
}

/// The id of the key `stored` was sealed with; `None`: not sealed.
pub fn sealed_key(stored: &str) -> Option<String> {
    envelope(stored).map(|s| s.key)
}

/// Whether `stored` is a sealed value.
pub fn is_sealed(stored: &str) -> bool {
    envelope(stored).is_some()
}

/// What a viewer is shown instead of a sealed value: `encrypted (key k2)`.
pub fn shown(stored: &str) -> Option<String> {
    sealed_key(stored).map(|key| format!("encrypted (key {key})"))
}

#[cfg(feature = "encrypt")]
fn decode_key(text: &str) -> Result<[u8; 32], CryptoError> {
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|_| {
            CryptoError::BadKey("a key must be base64 (openssl rand -base64 32)".into())
        })?;
    <[u8; 32]>::try_from(bytes.as_slice()).map_err(|_| {
        CryptoError::BadKey(format!(
            "a key must be 32 bytes, got {} (openssl rand -base64 32)",
            bytes.len()
        ))
    })
}

#[cfg(not(feature = "encrypt"))]
fn decode_key(_text: &str) -> Result<[u8; 32], CryptoError> {
    Err(CryptoError::NotCompiled)
}

#[cfg(feature = "encrypt")]
mod aead {
    use base64::Engine as _;
    use chacha20poly1305::{
        XChaCha20Poly1305, XNonce,
        aead::{Aead, KeyInit, Payload},
    };

    use crate::crypto::CryptoError;

    const NONCE: usize = 24;

    /// Base64 of the nonce followed by the ciphertext and its tag.
    pub(super) fn seal(key: &[u8; 32], msg: &[u8], aad: &[u8]) -> Result<String, CryptoError> {
        let mut nonce = [0u8; NONCE];
        getrandom::fill(&mut nonce)
            .map_err(|e| CryptoError::BadKey(format!("no randomness for a nonce: {e}")))?;
        let cipher = XChaCha20Poly1305::new(key.into());
        let mut out = nonce.to_vec();
        out.extend(
            cipher
                .encrypt(&XNonce::from(nonce), Payload { msg, aad })
                .map_err(|_| CryptoError::BadKey("cannot seal".into()))?,
        );
        Ok(base64::engine::general_purpose::STANDARD.encode(out))
    }

    pub(super) fn open(key: &[u8; 32], data: &str, aad: &[u8]) -> Result<Vec<u8>, ()> {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(data)
            .map_err(|_| ())?;
        if bytes.len() < NONCE {
            return Err(());
        }
        let (nonce, sealed) = bytes.split_at(NONCE);
        let nonce: [u8; NONCE] = nonce.try_into().map_err(|_| ())?;
        XChaCha20Poly1305::new(key.into())
            .decrypt(&XNonce::from(nonce), Payload { msg: sealed, aad })
            .map_err(|_| ())
    }
}

#[cfg(not(feature = "encrypt"))]
mod aead {
    use crate::crypto::CryptoError;

    pub(super) fn seal(_key: &[u8; 32], _msg: &[u8], _aad: &[u8]) -> Result<String, CryptoError> {
        Err(CryptoError::NotCompiled)
    }

    pub(super) fn open(_key: &[u8; 32], _data: &str, _aad: &[u8]) -> Result<Vec<u8>, ()> {
        Err(())
    }
}

#[cfg(all(test, feature = "encrypt"))]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn keys() -> Keys {
        Keys::new().with("k1", [1; 32]).unwrap()
    }

    #[test]
    fn a_sealed_value_opens_for_its_definition_only() {
        let keys = keys();
        let sealed = keys.seal(r#"{"card":"4111"}"#, 7).unwrap();
        assert!(sealed.starts_with(SEALED_PREFIX), "{sealed}");
        assert!(!sealed.contains("4111"));
        assert_eq!(sealed_key(&sealed).as_deref(), Some("k1"));
        assert_eq!(keys.open(&sealed, 7).unwrap(), r#"{"card":"4111"}"#);
        assert_eq!(
            keys.open(&sealed, 8),
            Err(CryptoError::Refused("k1".into()))
        );
        // Two seals of one text differ (a fresh nonce each).
        assert_ne!(sealed, keys.seal(r#"{"card":"4111"}"#, 7).unwrap());
        let mut tampered: Sealed = serde_json::from_str(&sealed).unwrap();
        tampered.data.replace_range(40..44, "AAAA");
        let tampered = serde_json::to_string(&tampered).unwrap();
        assert_eq!(
            keys.open(&tampered, 7),
            Err(CryptoError::Refused("k1".into()))
        );
    }

    #[test]
    fn rotation_seals_with_the_current_key_and_opens_with_every_key() {
        let old = keys().seal("old", 1).unwrap();
        let keys = keys().with("k2", [2; 32]).unwrap().current("k2").unwrap();
        let new = keys.seal("new", 1).unwrap();
        assert_eq!(sealed_key(&new).as_deref(), Some("k2"));
        assert_eq!(keys.open(&old, 1).unwrap(), "old");
        let only_new = Keys::new().with("k2", [2; 32]).unwrap();
        assert_eq!(
            only_new.open(&old, 1),
            Err(CryptoError::UnknownKey("k1".into()))
        );
        assert_eq!(
            only_new.can_open(&old),
            Err(CryptoError::UnknownKey("k1".into()))
        );
        assert_eq!(only_new.can_open("{}"), Err(CryptoError::NotSealed));
    }

    #[test]
    fn keys_parse_from_text_and_never_print() {
        let b64 = "AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=";
        let keys = Keys::parse(&format!(" k2:{b64} , k1:{b64}")).unwrap();
        assert_eq!(keys.current_id(), Some("k2"));
        assert_eq!(keys.ids(), ["k1", "k2"]);
        assert!(!format!("{keys:?}").contains(b64));
        for bad in ["k1", "k1:short", "bad id:AQ==", &format!("k:{b64},k:{b64}")] {
            assert!(Keys::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(Keys::parse("").unwrap(), Keys::new());
        assert_eq!(Keys::new().seal("x", 1), Err(CryptoError::NoKey));
    }
}
