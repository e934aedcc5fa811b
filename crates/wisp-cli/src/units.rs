//! Parsing of sizes (`16M`), durations (`500ms`), addresses and port maps
//! on the command line. Sizes are parsed as wispd parses them
//! ([`wisp_vmm_process::units`]).

use std::time::Duration;

pub use wisp_vmm_process::units::parse_size;

/// Parse an amount of memory (`--mem`, `--memory`): a size with a unit,
/// e.g. `64M`, `1G`. A bare number is refused: `--mem 64` meant 64 MiB,
/// not 64 bytes.
pub fn parse_mem(s: &str) -> Result<u64, String> {
    let t = s.trim();
    if !t.is_empty() && t.chars().all(|c| c.is_ascii_digit()) {
        return Err(format!("'{s}' has no unit: write {t}M for MiB or {t}G for GiB (K, M, G, T)"));
    }
    parse_size(s)
}

/// Parse a duration: a number with a unit (ns, us, ms, s, m, h), e.g.
/// `1s`, `500ms`, `1.5s`; a bare number means seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| format!("'{s}' is not a duration (e.g. 1s, 500ms)"))?;
    let secs = match unit {
        "ns" => n / 1e9,
        "us" | "µs" => n / 1e6,
        "ms" => n / 1e3,
        "" | "s" => n,
        "m" | "min" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("'{s}': unknown duration unit '{unit}' (use ms, s, m)")),
    };
    Duration::try_from_secs_f64(secs).map_err(|_| format!("'{s}' is out of range"))
}

/// Parse a number of CPUs, e.g. `0.5`, `2` ([`wisp_api::MIN_CPUS`] and up).
pub fn parse_cpus(s: &str) -> Result<f64, String> {
    let c: f64 = s.trim().parse().map_err(|_| format!("'{s}' is not a number of CPUs (e.g. 0.5, 2)"))?;
    let max = wisp_api::action::MAX_CPUS;
    if !(wisp_api::MIN_CPUS..=max).contains(&c) {
        return Err(format!("'{s}': a number of CPUs from {} to {max}", wisp_api::MIN_CPUS));
    }
    Ok(c)
}

/// Parse an IPv4 address, e.g. `10.77.0.1`.
pub fn parse_ipv4(s: &str) -> Result<[u8; 4], String> {
    s.parse::<std::net::Ipv4Addr>().map(|a| a.octets()).map_err(|_| format!("'{s}' is not an IPv4 address"))
}

/// Parse an IPv4 address with a prefix length, e.g. `10.77.0.2/24`.
pub fn parse_ipv4_cidr(s: &str) -> Result<([u8; 4], u8), String> {
    let (a, p) = s.split_once('/').ok_or_else(|| format!("'{s}': expected ADDRESS/PREFIX, e.g. 10.77.0.2/24"))?;
    let p: u8 = p.parse().ok().filter(|p| *p <= 32).ok_or_else(|| format!("'{s}': prefix must be 0..=32"))?;
    Ok((parse_ipv4(a)?, p))
}

/// Parse a port mapping `[ADDR:]HOSTPORT:VMPORT`, e.g. `8013:13` (on
/// 127.0.0.1) or `0.0.0.0:8013:13` (every address).
pub fn parse_port_map(s: &str) -> Result<wisp_api::PortMap, String> {
    s.parse()
}

/// `NETNS[:IFNAME]=ADDRESS/N` (`wisp run --link`).
pub fn parse_link(s: &str) -> Result<wisp_api::LinkSpec, String> {
    let (at, address) = s.split_once('=').ok_or_else(|| format!("{s:?}: expected NETNS[:IFNAME]=ADDRESS/N, e.g. client7=10.200.7.1/30"))?;
    let (netns, ifname) = match at.split_once(':') {
        Some((n, i)) => (n, i.to_string()),
        None => (at, "eth0".to_string()),
    };
    let l = wisp_api::LinkSpec { netns: netns.into(), ifname, address: address.into() };
    match l.invalid() {
        Some(why) => Err(why),
        None => Ok(l),
    }
}

/// Parse a MAC address, e.g. `52:54:00:12:34:56`.
pub fn parse_mac(s: &str) -> Result<[u8; 6], String> {
    let parts: Vec<&str> = s.split(':').collect();
    let err = || format!("'{s}' is not a MAC address (e.g. 52:54:00:12:34:56)");
    if parts.len() != 6 {
        return Err(err());
    }
    let mut m = [0u8; 6];
    for (i, p) in parts.iter().enumerate() {
        m[i] = u8::from_str_radix(p, 16).map_err(|_| err())?;
    }
    if m[0] & 1 != 0 {
        return Err(format!("'{s}' is a multicast address"));
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        assert_eq!(parse_ipv4_cidr("10.77.0.2/24"), Ok(([10, 77, 0, 2], 24)));
        assert!(parse_ipv4_cidr("10.77.0.2").is_err());
        assert!(parse_ipv4_cidr("10.77.0.2/33").is_err());
        assert!(parse_ipv4("300.1.1.1").is_err());
        assert_eq!(parse_mac("52:54:00:12:34:56"), Ok([0x52, 0x54, 0, 0x12, 0x34, 0x56]));
        assert!(parse_mac("01:00:00:00:00:00").is_err());
        assert!(parse_mac("52:54:00").is_err());
        assert_eq!(parse_port_map("8013:13"), Ok(wisp_api::PortMap { host: 8013, vm: 13, addr: None }));
        let any = parse_port_map("0.0.0.0:8013:13").map(|m| (m.host, m.vm, m.host_addr()));
        assert_eq!(any, Ok((8013, 13, [0, 0, 0, 0].into())));
        assert!(parse_port_map("0:13").is_err());
        assert!(parse_port_map("8013").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert!(parse_duration("1y").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn memory_needs_a_unit() {
        assert_eq!(parse_mem("64M"), Ok(64 << 20));
        assert_eq!(parse_mem("1g"), Ok(1 << 30));
        let e = parse_mem("64").unwrap_err();
        assert!(e.contains("64M"), "{e}");
        assert!(parse_mem("64x").is_err());
    }

    #[test]
    fn cpus() {
        assert_eq!(parse_cpus("0.5"), Ok(0.5));
        assert_eq!(parse_cpus("2"), Ok(2.0));
        for bad in ["0", "-1", "0.001", "x", "", "NaN", "inf", "2000"] {
            assert!(parse_cpus(bad).is_err(), "{bad}");
        }
    }
}
