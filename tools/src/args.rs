//! What every subcommand's command line shares: sizes with binary suffixes, path MTUs,
//! percentages, and the device flags of the rdma-core and perftest programs.

use std::path::PathBuf;

use roce_verbs::PathMtu;

/// Every path MTU, smallest first.
const PATH_MTUS: [PathMtu; 5] = [
    PathMtu::Mtu256,
    PathMtu::Mtu512,
    PathMtu::Mtu1024,
    PathMtu::Mtu2048,
    PathMtu::Mtu4096,
];

/// The device flags `roce pingpong` and `roce perf` share, named as rdma-core's and
/// perftest's programs name them (their GID flags differ: `-g` and `-x`).
#[derive(clap::Args)]
pub struct DeviceArgs {
    /// Network interface to use (default: the first one, as rdma-core and perftest take
    /// the first device).
    #[arg(short = 'd', long = "ib-dev")]
    pub device: Option<String>,
    /// Port of the device (there is only 1).
    #[arg(short = 'i', long = "ib-port", default_value = "1", value_parser = parse_port)]
    pub ib_port: u8,
    /// Use kernel UDP sockets instead of AF_XDP (no root needed).
    #[arg(long)]
    pub udp: bool,
    /// Write every frame sent and received to this pcap file.
    #[arg(long, value_name = "FILE")]
    pub pcap: Option<PathBuf>,
    /// At the end, print the device's counters (rxe's hw_counters names) on stderr.
    #[arg(long)]
    pub stats: bool,
}

/// `16M`, `64K`, `1G`, `4096`: bytes, with binary suffixes (an `iB` after them is allowed).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let lower = text.trim().to_ascii_lowercase();
    let number = lower.strip_suffix("ib").unwrap_or(&lower);
    let (digits, shift) = match number.as_bytes().last() {
        Some(b'k') => (&number[..number.len() - 1], 10),
        Some(b'm') => (&number[..number.len() - 1], 20),
        Some(b'g') => (&number[..number.len() - 1], 30),
        _ => (number, 0),
    };
    let value: u64 = digits
        .parse()
        .map_err(|_| format!("`{text}` is not a size such as 4096, 64K, 16M or 1G"))?;
    let bytes = value
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("`{text}` is too large"))?;
    if bytes == 0 {
        return Err("the size must be at least 1 byte".into());
    }
    Ok(bytes)
}

/// A path MTU given in bytes.
pub fn parse_mtu(text: &str) -> Result<PathMtu, String> {
    text.trim()
        .parse()
        .ok()
        .and_then(path_mtu)
        .ok_or_else(|| "the MTU must be 256, 512, 1024, 2048 or 4096".into())
}

/// The path MTU of `bytes`, if it is one.
pub fn path_mtu(bytes: usize) -> Option<PathMtu> {
    PATH_MTUS.into_iter().find(|mtu| mtu.bytes() == bytes)
}

/// The path MTU of an `ibv_mtu` value (1 for 256 bytes up to 5 for 4096), as perftest
/// exchanges it.
pub fn path_mtu_from_enum(value: u8) -> Option<PathMtu> {
    PATH_MTUS.into_iter().find(|&mtu| mtu as u8 == value)
}

/// A percentage from 0 to 100, returned as a probability.
pub fn parse_percent(text: &str) -> Result<f64, String> {
    let percent: f64 = text
        .trim()
        .trim_end_matches('%')
        .parse()
        .map_err(|_| format!("`{text}` is not a percentage such as 5 or 0.5"))?;
    if !(0.0..=100.0).contains(&percent) {
        return Err("a percentage must be between 0 and 100".into());
    }
    Ok(percent / 100.0)
}

fn parse_port(text: &str) -> Result<u8, String> {
    match text.trim() {
        "1" => Ok(1),
        _ => Err("only port 1 exists".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("16m"), Ok(16 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("256MiB"), Ok(256 << 20));
        for bad in ["", "M", "0", "1.5M", "-1", "1T", "99999999999G"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn percentages() {
        assert_eq!(parse_percent("5"), Ok(0.05));
        assert_eq!(parse_percent("0.5"), Ok(0.005));
        assert_eq!(parse_percent("100%"), Ok(1.0));
        for bad in ["-1", "100.5", "x", "NaN"] {
            assert!(parse_percent(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn mtus() {
        assert_eq!(parse_mtu("256"), Ok(PathMtu::Mtu256));
        assert_eq!(parse_mtu("4096"), Ok(PathMtu::Mtu4096));
        assert!(parse_mtu("300").is_err());
        assert!(parse_mtu("8192").is_err());
        assert_eq!(path_mtu_from_enum(3), Some(PathMtu::Mtu1024));
        assert_eq!(path_mtu_from_enum(5), Some(PathMtu::Mtu4096));
        assert_eq!(path_mtu_from_enum(0), None);
        assert_eq!(path_mtu_from_enum(6), None);
    }

    #[test]
    fn only_port_one() {
        assert_eq!(parse_port("1"), Ok(1));
        assert!(parse_port("2").is_err());
    }
}
