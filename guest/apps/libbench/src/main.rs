//! The guest of `make bench-libs` (`bench/libs.py`, `docs/libraries.md`),
//! given `build/libs/bench.so`:
//!
//! - `libbench update`: KylinX's live-update experiment — rounds of calls
//!   of all 111 functions of the library (each adds to its own variable),
//!   1 ms apart; when a live update changed the library's version, it
//!   checks that all 111 variables were carried over and says how long the
//!   switch held the VM (its own clock), and goes on for the next update;
//! - `libbench touch`: reads every page of the library's 1 MiB table, says
//!   so, and sleeps (the memory benchmark);
//! - `libbench idle`: says so and sleeps (the VMs' own pages, no library).
#![no_std]
#![no_main]

wisp::main!(main);

macro_rules! library {
    ($($f:ident),*; $($v:ident),*) => {
        $(wisp::lib_fn!(bench, fn $f(x: u64) -> u64);)*
        $(wisp::lib_var!(bench, $v: u64);)*
        /// Every function, in order.
        const FNS: [unsafe fn(u64) -> u64; 111] = [$($f),*];
        /// Every variable's address, in order.
        const VARS: [fn() -> *mut u64; 111] = [$($v),*];
    };
}

library!(bench_f0, bench_f1, bench_f2, bench_f3, bench_f4, bench_f5, bench_f6, bench_f7, bench_f8, bench_f9, bench_f10, bench_f11, bench_f12, bench_f13, bench_f14, bench_f15, bench_f16, bench_f17, bench_f18, bench_f19, bench_f20, bench_f21, bench_f22, bench_f23, bench_f24, bench_f25, bench_f26, bench_f27, bench_f28, bench_f29, bench_f30, bench_f31, bench_f32, bench_f33, bench_f34, bench_f35, bench_f36, bench_f37, bench_f38, bench_f39, bench_f40, bench_f41, bench_f42, bench_f43, bench_f44, bench_f45, bench_f46, bench_f47, bench_f48, bench_f49, bench_f50, bench_f51, bench_f52, bench_f53, bench_f54, bench_f55, bench_f56, bench_f57, bench_f58, bench_f59, bench_f60, bench_f61, bench_f62, bench_f63, bench_f64, bench_f65, bench_f66, bench_f67, bench_f68, bench_f69, bench_f70, bench_f71, bench_f72, bench_f73, bench_f74, bench_f75, bench_f76, bench_f77, bench_f78, bench_f79, bench_f80, bench_f81, bench_f82, bench_f83, bench_f84, bench_f85, bench_f86, bench_f87, bench_f88, bench_f89, bench_f90, bench_f91, bench_f92, bench_f93, bench_f94, bench_f95, bench_f96, bench_f97, bench_f98, bench_f99, bench_f100, bench_f101, bench_f102, bench_f103, bench_f104, bench_f105, bench_f106, bench_f107, bench_f108, bench_f109, bench_f110; bench_v0, bench_v1, bench_v2, bench_v3, bench_v4, bench_v5, bench_v6, bench_v7, bench_v8, bench_v9, bench_v10, bench_v11, bench_v12, bench_v13, bench_v14, bench_v15, bench_v16, bench_v17, bench_v18, bench_v19, bench_v20, bench_v21, bench_v22, bench_v23, bench_v24, bench_v25, bench_v26, bench_v27, bench_v28, bench_v29, bench_v30, bench_v31, bench_v32, bench_v33, bench_v34, bench_v35, bench_v36, bench_v37, bench_v38, bench_v39, bench_v40, bench_v41, bench_v42, bench_v43, bench_v44, bench_v45, bench_v46, bench_v47, bench_v48, bench_v49, bench_v50, bench_v51, bench_v52, bench_v53, bench_v54, bench_v55, bench_v56, bench_v57, bench_v58, bench_v59, bench_v60, bench_v61, bench_v62, bench_v63, bench_v64, bench_v65, bench_v66, bench_v67, bench_v68, bench_v69, bench_v70, bench_v71, bench_v72, bench_v73, bench_v74, bench_v75, bench_v76, bench_v77, bench_v78, bench_v79, bench_v80, bench_v81, bench_v82, bench_v83, bench_v84, bench_v85, bench_v86, bench_v87, bench_v88, bench_v89, bench_v90, bench_v91, bench_v92, bench_v93, bench_v94, bench_v95, bench_v96, bench_v97, bench_v98, bench_v99, bench_v100, bench_v101, bench_v102, bench_v103, bench_v104, bench_v105, bench_v106, bench_v107, bench_v108, bench_v109, bench_v110);
wisp::lib_fn!(bench, fn bench_version() -> u32);
wisp::lib_fn!(bench, fn bench_touch(from: usize) -> u64);

fn main() -> i32 {
    match wisp::env::arg(1) {
        Some("update") => update(),
        Some("touch") => {
            // SAFETY: bench_touch reads the library's own table.
            let sum = unsafe { bench_touch(0) };
            wisp::println!("libbench: touched the table ({})", sum);
            wisp::time::sleep(core::time::Duration::from_secs(86400));
            0
        }
        Some("idle") => {
            wisp::println!("libbench: idle");
            wisp::time::sleep(core::time::Duration::from_secs(86400));
            0
        }
        _ => {
            wisp::eprintln!("usage: libbench update|touch|idle");
            2
        }
    }
}

/// Rounds of calls through live updates, as the module says.
fn update() -> i32 {
    // SAFETY: bench_version takes nothing and returns a number.
    let mut version = unsafe { bench_version() };
    let mut rounds = 0u64;
    loop {
        for f in FNS {
            // SAFETY: bench.so's functions take and return a u64.
            unsafe { f(1) };
        }
        rounds += 1;
        if rounds == 3 {
            // Ready: from here a variable lost in an update (back to 0,
            // at most 2 by the end of the round) is told from one carried.
            wisp::println!("libbench: version {}", version);
        }
        // SAFETY: as above.
        let v = unsafe { bench_version() };
        if v != version {
            version = v;
            // Carried over: every call of every round so far added at
            // least 1 to each variable (an update may come between a
            // round's calls: the variables then differ by a step).
            let ok = VARS.iter().all(|a| {
                // SAFETY: the library's variables, read where it keeps them now.
                unsafe { core::ptr::read_volatile(a()) >= rounds }
            });
            wisp::println!("libbench: version {} carried={} held_ns={}", v, if ok { "all" } else { "lost" }, wisp::lib::last_switch_ns());
        }
        wisp::time::sleep(core::time::Duration::from_millis(1));
    }
}
