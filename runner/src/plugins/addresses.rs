//! Which addresses a plugin may reach through a name: none in the IANA special-purpose address
//! registries (IPv4 and IPv6, every entry), kept here as tables with a test made from them.

use std::net::IpAddr;

/// The IANA IPv4 Special-Purpose Address Registry, every entry (whatever its "globally
/// reachable" column says: each is a range a team's plugin has no business calling), and the
/// multicast block: (first address, prefix length, what it is).
pub const SPECIAL_V4: &[(&str, u8, &str)] = &[
    ("0.0.0.0", 8, "this network"),
    ("10.0.0.0", 8, "private-use"),
    ("100.64.0.0", 10, "shared address space"),
    ("127.0.0.0", 8, "loopback"),
    ("169.254.0.0", 16, "link local"),
    ("172.16.0.0", 12, "private-use"),
    ("192.0.0.0", 24, "IETF protocol assignments"),
    ("192.0.2.0", 24, "documentation (TEST-NET-1)"),
    ("192.31.196.0", 24, "AS112-v4"),
    ("192.52.193.0", 24, "AMT"),
    ("192.88.99.0", 24, "deprecated (6to4 relay anycast)"),
    ("192.168.0.0", 16, "private-use"),
    ("192.175.48.0", 24, "direct delegation AS112 service"),
    ("198.18.0.0", 15, "benchmarking"),
    ("198.51.100.0", 24, "documentation (TEST-NET-2)"),
    ("203.0.113.0", 24, "documentation (TEST-NET-3)"),
    ("224.0.0.0", 4, "multicast"),
    ("240.0.0.0", 4, "reserved"),
    ("255.255.255.255", 32, "limited broadcast"),
];

/// The IANA IPv6 Special-Purpose Address Registry, every entry, and the blocks IPv6 itself sets
/// apart (multicast, the deprecated site-local): (first address, prefix length, what it is).
/// One translation prefix is judged by the IPv4 address it carries instead (see [`is_public`]).
pub const SPECIAL_V6: &[(&str, u8, &str)] = &[
    ("::1", 128, "loopback"),
    ("::", 128, "unspecified"),
    ("::", 96, "IPv4-compatible (deprecated; holds :: and ::1)"),
    ("::ffff:0:0", 96, "IPv4-mapped"),
    ("::ffff:0:0:0", 96, "IPv4-translated"),
    ("64:ff9b:1::", 48, "local-use IPv4/IPv6 translation"),
    ("100::", 64, "discard-only"),
    ("100:0:0:1::", 64, "dummy IPv6 prefix"),
    (
        "2001::",
        23,
        "IETF protocol assignments (TEREDO, benchmarking, AMT, AS112, ORCHID, ...)",
    ),
    ("2001:db8::", 32, "documentation"),
    ("2002::", 16, "6to4"),
    ("2620:4f:8000::", 48, "direct delegation AS112 service"),
    ("3fff::", 20, "documentation"),
    ("5f00::", 16, "segment routing (SRv6) SIDs"),
    ("fc00::", 7, "unique-local"),
    ("fe80::", 10, "link-local unicast"),
    (
        "fec0::",
        10,
        "site-local (deprecated, still routed inside sites)",
    ),
    ("ff00::", 8, "multicast"),
];

/// Whether `ip` lies in a range of `table`.
fn in_table(ip: IpAddr, table: &[(&str, u8, &str)]) -> bool {
    let (bits, width) = match ip {
        IpAddr::V4(a) => (u128::from(u32::from(a)), 32),
        IpAddr::V6(a) => (u128::from(a), 128),
    };
    table.iter().any(|(first, len, _)| {
        let first = match first.parse::<IpAddr>() {
            Ok(IpAddr::V4(a)) if width == 32 => u128::from(u32::from(a)),
            Ok(IpAddr::V6(a)) if width == 128 => u128::from(a),
            _ => return false,
        };
        let shift = width - u32::from(*len);
        shift >= width || (bits >> shift) == (first >> shift)
    })
}

/// Whether a plugin may reach `ip` through a name: not in any range of the IANA special-purpose
/// registries ([`SPECIAL_V4`], [`SPECIAL_V6`]: loopback, private, link-local, shared,
/// documentation, benchmarking, the IPv6 forms that carry an IPv4 address, ...). An address of
/// the well-known NAT64 prefix (`64:ff9b::/96`, the only registry entry an IPv6-only network
/// with DNS64 needs for every IPv4 host) is judged by the IPv4 address it carries.
pub fn is_public(ip: IpAddr) -> bool {
    if let IpAddr::V6(a) = ip
        && let [0x64, 0xff9b, 0, 0, 0, 0, hi, lo] = a.segments()
    {
        let v4 = std::net::Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
        return is_public(IpAddr::V4(v4));
    }
    !in_table(ip, SPECIAL_V4) && !in_table(ip, SPECIAL_V6)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_addresses() {
        // (address, public?, what it is)
        let table = [
            ("127.0.0.1", false, "loopback"),
            ("10.1.2.3", false, "private"),
            ("172.16.0.1", false, "private"),
            ("192.168.1.1", false, "private"),
            ("169.254.169.254", false, "link-local: cloud metadata"),
            ("0.0.0.0", false, "unspecified"),
            ("100.64.0.1", false, "shared (CGNAT)"),
            ("192.0.0.8", false, "IETF protocol assignments"),
            ("198.18.0.1", false, "benchmarking"),
            ("240.0.0.1", false, "reserved"),
            ("::1", false, "loopback"),
            ("::", false, "unspecified"),
            ("fe80::1", false, "link-local"),
            ("fec0::1", false, "site-local"),
            ("fd00::1", false, "unique local"),
            ("2001:db8::1", false, "documentation"),
            ("::ffff:127.0.0.1", false, "IPv4-mapped loopback"),
            ("::ffff:169.254.169.254", false, "IPv4-mapped metadata"),
            ("::127.0.0.1", false, "IPv4-compatible loopback"),
            ("::10.0.0.1", false, "IPv4-compatible private"),
            ("64:ff9b::a9fe:a9fe", false, "NAT64 of 169.254.169.254"),
            ("64:ff9b::10.0.0.1", false, "NAT64 of 10.0.0.1"),
            ("64:ff9b:1::7f00:1", false, "local-use NAT64 of 127.0.0.1"),
            ("2002:7f00:1::", false, "6to4 of 127.0.0.1"),
            ("2002:a9fe:a9fe::1", false, "6to4 of 169.254.169.254"),
            ("2002:c0a8:101::1", false, "6to4 of 192.168.1.1"),
            (
                "2001:0:4136:e378:8000:63bf:f5ff:fffe",
                false,
                "Teredo of 10.0.0.1",
            ),
            ("192.88.99.1", false, "6to4 relay anycast"),
            ("::ffff:0:808:808", false, "IPv4-translated"),
            (
                "::ffff:8.8.8.8",
                false,
                "IPv4-mapped, even of a public address",
            ),
            ("2002:808:808::1", false, "6to4, even of a public address"),
            (
                "2001:0:4136:e378:8000:63bf:f7f7:f7f7",
                false,
                "Teredo, even of a public address",
            ),
            ("3fff::1", false, "documentation"),
            ("5f00::1", false, "SRv6 SIDs"),
            ("93.184.216.34", true, "public"),
            ("8.8.8.8", true, "public"),
            ("192.88.100.1", true, "just past 6to4 relay anycast"),
            ("2606:4700::1111", true, "public"),
            ("64:ff9b::808:808", true, "NAT64 of 8.8.8.8"),
        ];
        for (a, public, what) in table {
            assert_eq!(is_public(a.parse().unwrap()), public, "{a} ({what})");
        }
    }

    /// Every range of the registries: its first and last address are refused, and the
    /// addresses just outside it are judged as their own ranges say.
    #[test]
    fn every_special_purpose_range_is_refused() {
        for (table, width) in [(SPECIAL_V4, 32u32), (SPECIAL_V6, 128)] {
            for (first, len, what) in table {
                let ip: IpAddr = first.parse().unwrap();
                let bits = match ip {
                    IpAddr::V4(a) => u128::from(u32::from(a)),
                    IpAddr::V6(a) => u128::from(a),
                };
                let host = if u32::from(*len) == width {
                    0
                } else {
                    (1u128 << (width - u32::from(*len))) - 1
                };
                assert_eq!(
                    bits & host,
                    0,
                    "{first}/{len} ({what}) is not a range's first address"
                );
                let at = |b: u128| match ip {
                    IpAddr::V4(_) => IpAddr::V4(std::net::Ipv4Addr::from(b as u32)),
                    IpAddr::V6(_) => IpAddr::V6(std::net::Ipv6Addr::from(b)),
                };
                for b in [bits, bits | host] {
                    assert!(!is_public(at(b)), "{} in {first}/{len} ({what})", at(b));
                }
            }
        }
    }
}
