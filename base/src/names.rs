//! The names every part of the runner shares, each checked by one rule: a plugin's name, a
//! topic, a task's id and an owner, and the patterns a key or a setting names plugins and topics
//! with (`order-*`, `*`). The API, the store, the plugin host and the access checks all ask here,
//! so a name one of them takes is a name every other takes.
//!
//! [`PluginName`], [`Topic`], [`TaskId`] and [`Owner`] are those names as types: each is checked
//! by its rule when it is made and can't be made otherwise, so a function that takes one (the
//! task service's actions do) can't be given a name nobody checked.

/// Ids and owners: at most this many bytes.
pub const MAX_ID_BYTES: usize = 200;

/// A name its rule refuses; the message names the field and the rule.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadName(pub String);

/// A name type: a `String` made only through its rule, read as a `&str`.
macro_rules! checked_name {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            pub fn as_str(&self) -> &str {
                &self.0
            }

            pub fn into_string(self) -> String {
                self.0
            }
        }

        impl std::ops::Deref for $name {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }

        /// As its text's: a message's `{id:?}` quotes it.
        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                std::fmt::Debug::fmt(&self.0, f)
            }
        }
    };
}

checked_name!(
    /// A plugin's name: `[a-z0-9][a-z0-9-]{0,63}`.
    PluginName
);
checked_name!(
    /// A topic: 1 to 64 of `a-z 0-9 . _ -`.
    Topic
);
checked_name!(
    /// A task's id: 1 to [`MAX_ID_BYTES`] bytes without control characters.
    TaskId
);
checked_name!(
    /// An owner: the rule of a task's id.
    Owner
);

impl PluginName {
    /// `name` if it is a plugin name; `field` says where it was given (`plugin`, `[3].plugin`).
    pub fn new(field: &str, name: impl Into<String>) -> Result<PluginName, BadName> {
        let name = name.into();
        plugin_name_in(field, &name)?;
        Ok(PluginName(name))
    }
}

impl Topic {
    pub fn new(topic: impl Into<String>) -> Result<Topic, BadName> {
        let topic = topic.into();
        if valid_topic(&topic) {
            Ok(Topic(topic))
        } else {
            Err(BadName(format!(
                "{topic:?} is not a topic: 1 to 64 of a-z 0-9 . _ -"
            )))
        }
    }
}

impl TaskId {
    pub fn new(id: impl Into<String>) -> Result<TaskId, BadName> {
        let id = id.into();
        id_in("the task id", &id)?;
        Ok(TaskId(id))
    }
}

impl Owner {
    pub fn new(owner: impl Into<String>) -> Result<Owner, BadName> {
        let owner = owner.into();
        id_in("the owner", &owner)?;
        Ok(Owner(owner))
    }
}

/// Refused, with a message naming `field`, unless `name` is a plugin name.
pub fn plugin_name_in(field: &str, name: &str) -> Result<(), BadName> {
    if valid_plugin_name(name) {
        Ok(())
    } else {
        Err(BadName(format!(
            "{field} {name:?} is not a plugin name ([a-z0-9][a-z0-9-]{{0,63}})"
        )))
    }
}

/// Ids and owners: 1 to [`MAX_ID_BYTES`] bytes of UTF-8 without control characters.
pub fn id_like(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_ID_BYTES && !s.chars().any(char::is_control)
}

/// Refused, with a message naming `field`, unless `s` is [`id_like`].
pub fn id_in(field: &str, s: &str) -> Result<(), BadName> {
    if id_like(s) {
        Ok(())
    } else {
        Err(BadName(format!(
            "{field} must be 1 to {MAX_ID_BYTES} bytes without control characters (got {} bytes)",
            s.len()
        )))
    }
}

/// Plugin names: `[a-z0-9][a-z0-9-]{0,63}`.
pub fn valid_plugin_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

/// A topic name: 1 to 64 of a-z 0-9 . _ -
pub fn valid_topic(t: &str) -> bool {
    !t.is_empty()
        && t.len() <= 64
        && t.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
}

/// Whether `p` is a plugin pattern: a plugin name, or a name's prefix followed by `*`.
pub fn valid_pattern(p: &str) -> bool {
    match p.strip_suffix('*') {
        Some("") => true,
        Some(prefix) => {
            prefix.len() < 64
                && prefix
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !prefix.starts_with('-')
        }
        None => valid_plugin_name(p),
    }
}

/// Whether `pattern` covers the plugin `name`.
pub fn matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => pattern == name,
    }
}

/// Whether `p` is a topic pattern: a topic, a prefix of one ending in `*`, or `*`.
pub fn valid_topic_pattern(p: &str) -> bool {
    match p.strip_suffix('*') {
        Some("") => true,
        Some(prefix) => valid_topic(prefix),
        None => valid_topic(p),
    }
}

/// Whether every plugin `inner` covers is covered by one of `outer`.
pub fn covers(outer: &[String], inner: &str) -> bool {
    let inner_prefix = inner.strip_suffix('*');
    outer
        .iter()
        .any(|o| match (o.strip_suffix('*'), inner_prefix) {
            (Some(op), Some(ip)) => ip.starts_with(op),
            (Some(op), None) => inner.starts_with(op),
            (None, Some(_)) => false,
            (None, None) => o == inner,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_names() {
        assert!(valid_plugin_name("auto-feed"));
        assert!(valid_plugin_name("a"));
        assert!(valid_plugin_name("0x"));
        assert!(!valid_plugin_name("-a"));
        assert!(!valid_plugin_name("Auto"));
        assert!(!valid_plugin_name(""));
        assert!(!valid_plugin_name(&"a".repeat(65)));
        assert!(!valid_plugin_name("a_b"));
    }

    #[test]
    fn a_name_type_is_made_only_through_its_rule() {
        assert_eq!(
            PluginName::new("plugin", "auto-feed").unwrap().as_str(),
            "auto-feed"
        );
        assert_eq!(
            PluginName::new("[3].plugin", "Auto").unwrap_err().0,
            "[3].plugin \"Auto\" is not a plugin name ([a-z0-9][a-z0-9-]{0,63})"
        );
        assert!(Topic::new("pet.fed").is_ok());
        assert!(Topic::new("a b").unwrap_err().0.contains("is not a topic"));
        assert_eq!(&*TaskId::new("order-1").unwrap(), "order-1");
        assert_eq!(format!("{:?}", TaskId::new("a\"b").unwrap()), r#""a\"b""#);
        assert!(
            TaskId::new("a\nb")
                .unwrap_err()
                .0
                .starts_with("the task id must be")
        );
        assert!(TaskId::new("x".repeat(MAX_ID_BYTES + 1)).is_err());
        assert!(
            Owner::new("")
                .unwrap_err()
                .0
                .starts_with("the owner must be")
        );
        assert!(Owner::new("merchant 7").is_ok());
    }

    #[test]
    fn topics() {
        assert!(valid_topic("order"));
        assert!(valid_topic("pet.v2_x-y"));
        assert!(!valid_topic(""));
        assert!(!valid_topic("Order"));
        assert!(!valid_topic("a b"));
    }

    #[test]
    fn patterns() {
        for ok in ["*", "order-*", "order-cancel", "a*", "a"] {
            assert!(valid_pattern(ok), "{ok}");
        }
        for bad in ["", "**", "Order-*", "order-*-x", "-*", "a b", "x*y"] {
            assert!(!valid_pattern(bad), "{bad}");
        }
        assert!(matches("*", "anything"));
        assert!(matches("order-*", "order-cancel"));
        assert!(!matches("order-*", "orders"));
        assert!(matches("order-cancel", "order-cancel"));
        assert!(!matches("order-cancel", "order-cancel-2"));
    }

    #[test]
    fn covering() {
        let outer = vec!["order-*".to_owned(), "pet-feed".to_owned()];
        assert!(covers(&outer, "order-cancel"));
        assert!(covers(&outer, "order-x*"));
        assert!(covers(&outer, "pet-feed"));
        assert!(!covers(&outer, "pet-*"));
        assert!(!covers(&outer, "*"));
        assert!(covers(&["*".to_owned()], "*"));
    }
}
