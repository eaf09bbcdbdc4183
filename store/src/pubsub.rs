//! Subscriptions to the namespace's pub/sub channels (wake-ups, plugin announcements), kept up
//! across Redis restarts and failovers.

use std::time::Duration;

use anyhow::Result;
use futures::StreamExt;
use tracing::warn;

use super::Store;

/// What a subscription hears.
#[derive(Debug, PartialEq, Eq)]
pub enum Heard {
    /// Subscribed, for the first time or again after the connection dropped: what was published
    /// meanwhile was missed.
    Subscribed,
    /// A message's payload.
    Message(String),
}

/// A subscription to one channel that reconnects on its own (with backoff), saying when it did.
pub struct Subscription {
    store: Store,
    channel: String,
    /// What it is for, in its log lines ("wake-ups").
    what: &'static str,
    /// Subscriptions made so far: a reconnect may try another node (`RedisTarget::pubsub_client`).
    attempt: usize,
    messages: Option<redis::aio::PubSubStream>,
}

impl Store {
    /// A subscription to `channel` (not yet connected: the first `next` connects).
    pub fn subscribe(&self, channel: String, what: &'static str) -> Subscription {
        Subscription {
            store: self.clone(),
            channel,
            what,
            attempt: 0,
            messages: None,
        }
    }
}

impl Subscription {
    /// The next thing heard. Waits through any outage, resubscribing with backoff (every
    /// failure logged). Cancel-safe: dropping it loses no message already received.
    pub async fn next(&mut self) -> Heard {
        let mut delay = Duration::from_millis(100);
        loop {
            if let Some(messages) = &mut self.messages {
                match messages.next().await {
                    Some(m) => return Heard::Message(m.get_payload().unwrap_or_default()),
                    None => {
                        self.messages = None;
                        warn!("the {} subscription dropped; resubscribing", self.what);
                    }
                }
            }
            match self.connect().await {
                Ok(messages) => {
                    self.messages = Some(messages);
                    return Heard::Subscribed;
                }
                Err(e) => {
                    warn!(
                        "subscribing to {} failed, retrying in {delay:?}: {e:#}",
                        self.what
                    );
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(2));
                }
            }
        }
    }

    async fn connect(&mut self) -> Result<redis::aio::PubSubStream> {
        let attempt = self.attempt;
        self.attempt += 1;
        let mut ps = self
            .store
            .pubsub_client(attempt)
            .await?
            .get_async_pubsub()
            .await?;
        ps.subscribe(&self.channel).await?;
        Ok(ps.into_on_message())
    }
}
