//! The image-note manifest parser: `ImageNote::parse` over any descriptor never panics, and a
//! manifest it accepts encodes back to bytes that parse to the same manifest.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wisp_abi::bootinfo::MAX_DEVICES;
use wisp_abi::manifest::DEVICE_NAME_SIZE;
use wisp_abi::{features, DeviceKind, ImageNote, ABI_VERSION, IMAGE_NOTE_SIZE};

fn encode(n: &ImageNote) -> Vec<u8> {
    let mut b = Vec::with_capacity(IMAGE_NOTE_SIZE);
    for w in [n.abi_version, n.device_count, n.features[0], n.features[1]] {
        b.extend_from_slice(&w.to_le_bytes());
    }
    for d in &n.devices {
        b.extend_from_slice(&d.kind.to_le_bytes());
        b.extend_from_slice(&d.flags.to_le_bytes());
        b.extend_from_slice(&d.name);
    }
    b
}

fuzz_target!(|data: &[u8]| {
    let Some(note) = ImageNote::parse(data) else {
        // Refused: too short for this version's layout, or too many devices.
        assert!(data.len() < 4 || data.len() < IMAGE_NOTE_SIZE || {
            let c = u32::from_le_bytes(data[4..8].try_into().unwrap());
            c as usize > MAX_DEVICES
        });
        return;
    };
    assert_eq!(note.abi_version, u32::from_le_bytes(data[..4].try_into().unwrap()));
    if note.abi_version != ABI_VERSION {
        assert_eq!(note.device_count, 0);
        return;
    }
    assert!(note.device_count as usize <= MAX_DEVICES);
    assert_eq!(note.devices().len(), note.device_count as usize);
    for d in note.devices() {
        assert!(d.name().len() <= DEVICE_NAME_SIZE);
        let _ = (d.required(), DeviceKind::from_u32(d.kind).map(DeviceKind::name));
    }
    let _ = features::Names(note.feature_bits()).to_string();
    let bytes = encode(&note);
    assert_eq!(bytes.len(), IMAGE_NOTE_SIZE);
    assert_eq!(&bytes[..], &data[..IMAGE_NOTE_SIZE], "the descriptor's bytes are all kept");
    assert_eq!(ImageNote::parse(&bytes), Some(note));
});
