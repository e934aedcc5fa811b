//! The data device: the environment and read-only files a VM is given at
//! start, laid out as `wisp_abi::data` says in a region at the top of RAM
//! and written there when the device is activated (before the guest's
//! first instruction). It is never kicked and keeps nothing of the host:
//! the guest owns its copy (a forked child has it too, in its memory).

use std::sync::Arc;

use wisp_abi::data::{DataHeader, DataRegion, FileEntry, DATA_MAGIC, ENTRY_SIZE, HEADER_SIZE, MAX_ENV_BYTES, MAX_FILES, MAX_PATH};
use wisp_abi::DeviceKind;
use zerocopy::IntoBytes;

use super::{Device, DeviceState};
use crate::control::Control;
use crate::error::{Error, Result};
use crate::memory::RamView;

/// A VM's environment and files, encoded.
pub struct DataDevice {
    /// The region until it is written into guest RAM.
    bytes: Vec<u8>,
    /// Its size (it stays the region's size once the bytes are gone).
    size: u64,
}

fn bad(msg: String) -> Error {
    Error::Devices(msg)
}

impl DataDevice {
    /// The region for environment entries `env` (`KEY=VALUE`) and `files`
    /// (guest path, contents), checked: keys are non-empty without `=`,
    /// nothing holds a NUL, paths are absolute, unique and at most
    /// [`MAX_PATH`] bytes, at most [`MAX_FILES`] files and
    /// [`MAX_ENV_BYTES`] of environment.
    pub fn new(env: &[String], files: &[(String, Arc<[u8]>)]) -> Result<DataDevice> {
        let mut env_bytes = Vec::new();
        for e in env {
            let key = e.split_once('=').map(|(k, _)| k).unwrap_or("");
            if key.is_empty() || e.contains('\0') {
                return Err(bad(format!("environment entry '{e}' is not KEY=VALUE (a non-empty key, no NUL)")));
            }
            env_bytes.extend_from_slice(e.as_bytes());
            env_bytes.push(0);
        }
        if env_bytes.len() > MAX_ENV_BYTES {
            return Err(bad(format!("the environment takes {} bytes, more than {MAX_ENV_BYTES}", env_bytes.len())));
        }
        if files.len() > MAX_FILES {
            return Err(bad(format!("{} files given, at most {MAX_FILES}", files.len())));
        }
        for (i, (path, _)) in files.iter().enumerate() {
            if !path.starts_with('/') || path.len() > MAX_PATH || path.contains('\0') {
                return Err(bad(format!("guest path '{path}' is not an absolute path of at most {MAX_PATH} bytes")));
            }
            if files[..i].iter().any(|(p, _)| p == path) {
                return Err(bad(format!("guest path '{path}' is given twice")));
            }
        }
        // (Offsets of names fit in u32: at most 64 KiB of environment and
        // MAX_FILES entries and paths precede them.)
        let env_off = HEADER_SIZE;
        let files_off = (env_off + env_bytes.len()).next_multiple_of(8);
        let mut names_at = files_off + files.len() * ENTRY_SIZE;
        let names_len: usize = files.iter().map(|(p, _)| p.len()).sum();
        let mut data_at = (names_at + names_len).next_multiple_of(8);
        let total = data_at + files.iter().map(|(_, d)| d.len().next_multiple_of(8)).sum::<usize>();
        let mut bytes = vec![0u8; total];
        let header = DataHeader {
            magic: DATA_MAGIC,
            env_count: env.len() as u32,
            env_len: env_bytes.len() as u32,
            env_off: env_off as u32,
            file_count: files.len() as u32,
            files_off: files_off as u32,
            reserved: 0,
        };
        bytes[..HEADER_SIZE].copy_from_slice(header.as_bytes());
        bytes[env_off..env_off + env_bytes.len()].copy_from_slice(&env_bytes);
        for (i, (path, data)) in files.iter().enumerate() {
            let e = FileEntry { name_off: names_at as u32, name_len: path.len() as u32, data_off: data_at as u64, size: data.len() as u64 };
            let at = files_off + i * ENTRY_SIZE;
            bytes[at..at + ENTRY_SIZE].copy_from_slice(e.as_bytes());
            bytes[names_at..names_at + path.len()].copy_from_slice(path.as_bytes());
            bytes[data_at..data_at + data.len()].copy_from_slice(data);
            names_at += path.len();
            data_at += data.len().next_multiple_of(8);
        }
        Ok(DataDevice { size: bytes.len() as u64, bytes })
    }

    /// The device for a region someone else encoded (the daemon, for its
    /// VMM process): read as the guest would, checked and encoded again.
    pub fn from_region(bytes: &[u8]) -> Result<DataDevice> {
        let r = DataRegion::parse(bytes).ok_or_else(|| bad("the environment and files region is malformed".into()))?;
        let text = |b: &[u8]| String::from_utf8(b.to_vec()).map_err(|_| bad("the environment and files region is not UTF-8 where it must be".into()));
        let env = r.env().map(|(k, v)| Ok(format!("{}={}", text(k)?, text(v)?))).collect::<Result<Vec<_>>>()?;
        let files = r.files().map(|(p, d)| Ok((text(p)?, Arc::from(d)))).collect::<Result<Vec<_>>>()?;
        DataDevice::new(&env, &files)
    }

    /// The device of a restored VM, whose region (of `size` bytes, the
    /// saved device's) is in the snapshot's pages already: nothing is
    /// written at activation.
    pub fn restored(size: u64) -> DataDevice {
        DataDevice { bytes: Vec::new(), size }
    }

    /// The encoded region (until the device is activated).
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

impl Device for DataDevice {
    fn kind(&self) -> DeviceKind {
        DeviceKind::Data
    }

    fn region_size(&self) -> u64 {
        self.size
    }

    fn params(&self) -> [u64; 5] {
        [0; 5]
    }

    fn activate(&mut self, ram: RamView, base: u64, _control: Arc<Control>, _user: &crate::access::UserMap) -> std::io::Result<()> {
        ram.write(base, &self.bytes).map_err(std::io::Error::other)?;
        // The guest has its copy: the host's can go.
        self.bytes = Vec::new();
        Ok(())
    }

    fn notify(&self) {}

    fn on_fork_child(&mut self) {}

    fn restore_state(&mut self, _state: &DeviceState) -> Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_encoded_reads_back() {
        let env = ["A=1".to_string(), "PATH=/x:/y".to_string(), "EMPTY=".to_string()];
        let files: Vec<(String, Arc<[u8]>)> = vec![("/etc/app.conf".into(), Arc::from(&b"x = 1\n"[..])), ("/empty".into(), Arc::from(&b""[..]))];
        let d = DataDevice::new(&env, &files).unwrap();
        let r = DataRegion::parse(&d.bytes).unwrap();
        let got: Vec<_> = r.env().collect();
        assert_eq!(got, [(&b"A"[..], &b"1"[..]), (b"PATH", b"/x:/y"), (b"EMPTY", b"")]);
        let got: Vec<_> = r.files().collect();
        assert_eq!(got, [(&b"/etc/app.conf"[..], &b"x = 1\n"[..]), (b"/empty", b"")]);
        let again = DataDevice::from_region(&d.bytes).unwrap();
        assert_eq!(again.bytes, d.bytes);
        assert!(DataDevice::from_region(&d.bytes[..20]).is_err());
    }

    #[test]
    fn bad_entries_are_refused() {
        let none: &[(String, Arc<[u8]>)] = &[];
        for e in ["NOEQ", "=v", "A=\0"] {
            assert!(DataDevice::new(&[e.to_string()], none).is_err(), "{e:?}");
        }
        let f = |p: &str| (p.to_string(), Arc::from(&b"x"[..]));
        assert!(DataDevice::new(&[], &[f("relative")]).is_err());
        assert!(DataDevice::new(&[], &[f("/a"), f("/a")]).is_err());
        assert!(DataDevice::new(&[], &[f(&format!("/{}", "x".repeat(MAX_PATH)))]).is_err());
        let big = vec![format!("K={}", "v".repeat(MAX_ENV_BYTES))];
        assert!(DataDevice::new(&big, none).is_err());
    }
}
