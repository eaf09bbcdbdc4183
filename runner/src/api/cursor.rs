//! Page cursors, sealed, and pages filled to their limit within the caller's scope.
//!
//! A walk of an index stops at a place that may be a task the caller can't see (the last place
//! a shard's walk looked at). Every cursor the API hands out is its place encrypted with
//! XChaCha20-Poly1305 under the namespace's cursor key (made once, kept in Redis) and bound to
//! its route: it says nothing to whoever holds it, can't be forged, and any runner of the
//! namespace opens it. A page holds `limit` tasks in the caller's scope when there are that many:
//! `fill` keeps walking past other teams' tasks, for at most `ROUNDS` reads of the index.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use tokio::sync::OnceCell;

use super::body::ApiResult;
use super::error::ApiError;
use eggtimer_store::Store;

/// How many reads of an index one page may take to fill up; past them the page is returned
/// short, with a cursor to go on from.
pub const ROUNDS: usize = 20;

/// Seals and opens the cursors of one namespace.
pub struct Cursors {
    store: Store,
    cipher: OnceCell<XChaCha20Poly1305>,
}

impl Cursors {
    pub fn new(store: Store) -> Cursors {
        Cursors {
            store,
            cipher: OnceCell::new(),
        }
    }

    async fn cipher(&self) -> ApiResult<&XChaCha20Poly1305> {
        self.cipher
            .get_or_try_init(|| async {
                let key = self.store.cursor_key().await?;
                Ok::<_, ApiError>(XChaCha20Poly1305::new((&key).into()))
            })
            .await
    }

    /// The cursor of `place` on `route`.
    pub async fn seal(&self, route: &str, place: &str) -> ApiResult<String> {
        let nonce: [u8; 24] = rand::random();
        let sealed = self
            .cipher()
            .await?
            .encrypt(
                XNonce::from_slice(&nonce),
                Payload {
                    msg: place.as_bytes(),
                    aad: route.as_bytes(),
                },
            )
            .map_err(|_| {
                ApiError::new(
                    axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "sealing a cursor failed",
                )
            })?;
        let mut out = nonce.to_vec();
        out.extend(sealed);
        Ok(URL_SAFE_NO_PAD.encode(out))
    }

    /// The place a cursor of `route` names: 400 for text that is not shaped as a cursor, 422 for
    /// one this namespace did not make for this route.
    pub async fn open(&self, route: &str, cursor: &str) -> ApiResult<String> {
        let shaped = (54..=1000).contains(&cursor.len())
            && cursor
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !shaped {
            return Err(ApiError::bad(
                "cursor is not one this API returned (54 to 1000 characters of URL-safe base64)",
            ));
        }
        let bytes = URL_SAFE_NO_PAD.decode(cursor).unwrap_or_default();
        let cipher = self.cipher().await?;
        let place = (bytes.len() > 24 + 16)
            .then(|| bytes.split_at(24))
            .and_then(|(nonce, sealed)| {
                cipher
                    .decrypt(
                        XNonce::from_slice(nonce),
                        Payload {
                            msg: sealed,
                            aad: route.as_bytes(),
                        },
                    )
                    .ok()
            })
            .and_then(|p| String::from_utf8(p).ok());
        place.ok_or_else(|| {
            ApiError::new(
                axum::http::StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_cursor",
                "cursor is not one this route returned: pass next_cursor back as it came",
            )
        })
    }
}

/// A page of up to `limit` items that `sees` lets through, read from `cursor` on with `read` (a
/// page of the index and where the next starts; None at the end), and the place after the last
/// item kept (None when the walk is over). `place` is an item's own place in the index.
pub async fn fill<T, P, R, Fut>(
    limit: usize,
    mut cursor: Option<P>,
    sees: impl Fn(&T) -> bool,
    place: impl Fn(&T) -> P,
    mut read: R,
) -> ApiResult<(Vec<T>, Option<P>)>
where
    R: FnMut(Option<P>) -> Fut,
    Fut: Future<Output = ApiResult<(Vec<T>, Option<P>)>>,
{
    let mut page = Vec::new();
    for _ in 0..ROUNDS {
        let (items, next) = read(cursor.take()).await?;
        let mut items = items.into_iter().filter(|t| sees(t));
        for item in items.by_ref() {
            page.push(item);
            if page.len() == limit {
                break;
            }
        }
        let more_here = items.next().is_some();
        if page.len() == limit {
            let last = page.last().map(&place);
            return Ok((
                page,
                if more_here || next.is_some() {
                    last
                } else {
                    None
                },
            ));
        }
        match next {
            None => return Ok((page, None)),
            Some(n) => cursor = Some(n),
        }
    }
    Ok((page, cursor))
}
