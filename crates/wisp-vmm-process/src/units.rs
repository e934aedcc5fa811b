//! Sizes as `wispd` and `wisp` take them on their command lines
//! (`--mem 16M`, `--pool 16M=4`, `wisp pool --set 16M=8`).

/// Parse a size: a number with an optional K/M/G/T suffix (binary, `KiB`,
/// `MB` etc. accepted), e.g. `16M`, `512KiB`, `1G`, `4194304`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("'{s}' is not a size (e.g. 16M, 1G)"))?;
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(format!("'{s}': unknown size unit '{unit}' (use K, M or G)")),
    };
    n.checked_mul(1u64 << shift).ok_or_else(|| format!("'{s}' is too large"))
}

/// Parse a pool target `MEM=COUNT`, e.g. `16M=8` (`wispd --pool`, `wisp
/// pool --set`): guest RAM in bytes and a number of shells.
pub fn parse_pool_target(s: &str) -> Result<(u64, u32), String> {
    let (m, c) = s.split_once('=').ok_or_else(|| format!("'{s}': expected MEM=COUNT"))?;
    let mem = parse_size(m)?;
    let count = c.parse().map_err(|_| format!("'{c}' is not a count"))?;
    Ok((mem, count))
}

/// Parse a NIC rate limit `BYTES[/FRAMES]` per second, for each direction
/// (`wisp run --net-rate`), e.g. `1M` (1 MiB/s) or `10M/2000` (and at most
/// 2,000 frames/s); `0` = unlimited.
pub fn parse_net_rate(s: &str) -> Result<wisp_vmm::NetRate, String> {
    let (b, f) = s.split_once('/').map_or((s, None), |(b, f)| (b, Some(f)));
    let bytes = parse_size(b)?;
    let ops = match f {
        None => 0,
        Some(f) => f.trim().parse().map_err(|_| format!("'{f}' is not a frame rate (frames per second)"))?,
    };
    let rate = wisp_vmm::Rate { bytes, ops };
    Ok(wisp_vmm::NetRate { tx: rate, rx: rate })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn net_rates() {
        let r = parse_net_rate("10M/2000").unwrap();
        assert_eq!((r.tx.bytes, r.tx.ops, r.rx.bytes), (10 << 20, 2000, 10 << 20));
        assert_eq!(parse_net_rate("1K").unwrap().tx.ops, 0);
        assert!(parse_net_rate("fast").is_err());
        assert!(parse_net_rate("1M/many").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("16M"), Ok(16 << 20));
        assert_eq!(parse_size("512KiB"), Ok(512 << 10));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size(" 2MB "), Ok(2 << 20));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("").unwrap_err().contains("not a size"));
        assert!(parse_size("M").unwrap_err().contains("not a size"));
        assert!(parse_size("12Q").unwrap_err().contains("unknown size unit 'Q'"));
        assert!(parse_size("99999999999T").unwrap_err().contains("too large"));
    }

    #[test]
    fn pool_targets() {
        assert_eq!(parse_pool_target("16M=8"), Ok((16 << 20, 8)));
        assert!(parse_pool_target("16M").unwrap_err().contains("expected MEM=COUNT"));
        assert!(parse_pool_target("16M=x").unwrap_err().contains("'x' is not a count"));
        assert!(parse_pool_target("16Q=1").unwrap_err().contains("unknown size unit"));
    }
}
