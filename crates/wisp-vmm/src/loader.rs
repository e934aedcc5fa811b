//! Putting an image into guest RAM, for a start and for a shell that loads
//! it ahead (`preload.rs`): its features checked against the monitor's,
//! its segments mapped copy-on-write or copied. A leaf below both.

use std::os::fd::AsFd;

use wisp_abi::layout::{align_up, PAGE_SIZE};

use crate::error::{Error, Result};
use crate::image::{Image, Segment};
use crate::memory::GuestRam;

/// The features of the ABI this monitor implements (`wisp_abi::features`).
pub const FEATURES: u64 = wisp_abi::features::FORK | wisp_abi::features::FAMILY | wisp_abi::features::STDIO | wisp_abi::features::READY;

/// The image's declared features, if this monitor has them all.
pub(crate) fn check_features(image: &Image) -> Result<u64> {
    let wanted = image.manifest.feature_bits();
    match wanted & !FEATURES {
        0 => Ok(wanted),
        missing => Err(Error::Unsupported(format!(
            "the image needs features this monitor lacks: {}",
            wisp_abi::features::Names(missing)
        ))),
    }
}

/// Put one segment's file bytes into guest RAM: whole pages copy-on-write
/// from the image's descriptor when it has one and the layout allows,
/// partial pages (and everything else) copied.
pub(crate) fn load_segment(ram: &GuestRam, image: &Image, s: &Segment) -> Result<()> {
    let data = image.file_bytes(s);
    let (start, end) = (s.vaddr, s.vaddr + s.filesz);
    let (first, last) = (align_up(start, PAGE_SIZE), end & !(PAGE_SIZE - 1));
    match &image.file {
        Some(fd) if s.vaddr % PAGE_SIZE == s.offset % PAGE_SIZE && last > first => {
            ram.write(start, &data[..(first - start) as usize])?;
            ram.map_file_cow(first, last - first, fd.as_fd(), s.offset + (first - start))?;
            ram.write(last, &data[(last - start) as usize..])
        }
        _ => ram.write(start, data),
    }
}
