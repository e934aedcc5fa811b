//! `wc [PATH...]`: count the lines, words and bytes of files given to the
//! VM (`wisp run --file HOST:GUEST`), or of standard input (`wisp run -i`)
//! without a path, as coreutils' wc prints them. `WC_ONLY=lines|words|bytes`
//! in the environment (`wisp run -e`) prints that count only. A path that
//! was not given is an error on standard error (exit 1).
#![no_std]
#![no_main]

extern crate alloc;

use alloc::vec::Vec;

wisp::main!(main);

#[derive(Default, Clone, Copy)]
struct Counts {
    lines: usize,
    words: usize,
    bytes: usize,
}

fn count(data: &[u8], c: &mut Counts, in_word: &mut bool) {
    c.bytes += data.len();
    for &b in data {
        if b == b'\n' {
            c.lines += 1;
        }
        let space = b.is_ascii_whitespace();
        if !space && !*in_word {
            c.words += 1;
        }
        *in_word = !space;
    }
}

fn show(c: Counts, name: &str, only: Option<&str>) -> Result<(), &'static str> {
    let n = match only {
        None => {
            wisp::println!("{:>7} {:>7} {:>7} {}", c.lines, c.words, c.bytes, name);
            return Ok(());
        }
        Some("lines") => c.lines,
        Some("words") => c.words,
        Some("bytes") => c.bytes,
        Some(_) => return Err("WC_ONLY must be lines, words or bytes"),
    };
    wisp::println!("{:>7} {}", n, name);
    Ok(())
}

fn main() -> i32 {
    let only = wisp::env::var("WC_ONLY");
    let paths: Vec<&str> = wisp::env::args().skip(1).collect();
    let mut code = 0;
    if paths.is_empty() {
        let (mut c, mut w) = (Counts::default(), false);
        let mut buf = [0u8; 4096];
        loop {
            match wisp::stdin::read(&mut buf) {
                0 => break,
                n => count(&buf[..n], &mut c, &mut w),
            }
        }
        if let Err(e) = show(c, "", only) {
            wisp::eprintln!("wc: {}", e);
            return 2;
        }
        return 0;
    }
    let mut total = Counts::default();
    for p in &paths {
        match wisp::fs::read(p) {
            Ok(data) => {
                let (mut c, mut w) = (Counts::default(), false);
                count(data, &mut c, &mut w);
                total.lines += c.lines;
                total.words += c.words;
                total.bytes += c.bytes;
                if let Err(e) = show(c, p, only) {
                    wisp::eprintln!("wc: {}", e);
                    return 2;
                }
            }
            Err(e) => {
                wisp::eprintln!("wc: {}: {}", p, e);
                code = 1;
            }
        }
    }
    if paths.len() > 1 {
        let _ = show(total, "total", only);
    }
    code
}
