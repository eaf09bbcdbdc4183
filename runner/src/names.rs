//! The names every part of the runner shares, each checked by one rule: a plugin's name, a
//! topic, and the patterns a key or a setting names plugins and topics with (`order-*`, `*`).
//! The API, the store, the plugin host and the access checks all ask here, so a name one of them
//! takes is a name every other takes.

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
