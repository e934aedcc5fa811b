#!/usr/bin/env python3
"""Writing an app: from a new app's crate to its first run, and how big
images are (issue: two commands, under 30 s of build after the library
OS's first build; `hello` at most 40 KB).

wisp: `wisp new NAME` in a scratch directory outside the repository, then
`wisp run ./NAME` (builds it with cargo for the guest target and boots it),
timed until `wisp run` exits; then one line of `src/main.rs` edited and
`wisp run ./NAME` again. Three cases: a first build with a target directory
of its own (the library OS and its dependencies compiled too), a first
build sharing a target directory in which the library OS was built once
("after the library OS's first build"), and the rebuild after the edit.

Peer, measured the same way in the same run: the host Rust equivalent,
`cargo new NAME` then `cargo run --release` of the same hello (std, the
host target), with the same three cases. Image sizes: the bundled apps
against a static C `hello` (`cc -static -Os`, stripped) and the host Rust
hello (release, stripped).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, log, machine_info, median  # noqa: E402

HELLO_C = '#include <stdio.h>\nint main(int c, char **v) { printf("Hello from C! args: %d\\n", c - 1); return 0; }\n'


def timed(argv, cwd, env, expect):
    t = time.monotonic()
    r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    dt = time.monotonic() - t
    if r.returncode != 0 or expect not in r.stdout:
        raise SystemExit("%s failed (%d): %s\n%s" % (" ".join(argv), r.returncode, r.stdout, r.stderr))
    return dt


def wisp_case(wisp, work, name, target_dir):
    env = dict(os.environ, WISP_SOCKET="/nonexistent/bench-app.sock")
    if target_dir:
        env["CARGO_TARGET_DIR"] = target_dir
    t_new = timed([wisp, "new", name], work, env, "wisp: made")
    t_run = timed([wisp, "run", "./" + name, "--", "x"], work, env, "Hello from %s!" % name)
    main = os.path.join(work, name, "src", "main.rs")
    with open(main) as f:
        src = f.read()
    with open(main, "w") as f:
        f.write(src.replace("Hello from", "Hi from"))
    t_edit = timed([wisp, "run", "./" + name, "--", "x"], work, env, "Hi from %s!" % name)
    return t_new + t_run, t_edit


def cargo_case(work, name, target_dir):
    env = dict(os.environ)
    if target_dir:
        env["CARGO_TARGET_DIR"] = target_dir
    t_new = timed(["cargo", "new", "--quiet", name], work, env, "")
    main = os.path.join(work, name, "src", "main.rs")
    with open(main, "w") as f:
        f.write('fn main() {\n    let args: Vec<String> = std::env::args().skip(1).collect();\n'
                '    println!("Hello from %s! args: {:?}", args);\n}\n' % name)
    with open(os.path.join(work, name, "Cargo.toml"), "a") as f:
        f.write('\n[profile.release]\nopt-level = "s"\nlto = true\ncodegen-units = 1\npanic = "abort"\nstrip = true\n')
    run = ["cargo", "run", "--quiet", "--release", "--", "x"]
    t_run = timed(run, os.path.join(work, name), env, "Hello from %s!" % name)
    with open(main) as f:
        src = f.read()
    with open(main, "w") as f:
        f.write(src.replace("Hello from", "Hi from"))
    t_edit = timed(run, os.path.join(work, name), env, "Hi from %s!" % name)
    exe = os.path.join(target_dir or os.path.join(work, name, "target"), "release", name)
    return t_new + t_run, t_edit, os.path.getsize(exe)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wisp", default=os.path.join(ROOT, "target/release/wisp"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/results/app.json"))
    args = ap.parse_args()
    wisp = os.path.abspath(args.wisp)
    work = tempfile.mkdtemp(prefix="wisp-bench-app-")
    res = {"wisp": {"own_target": [], "shared_target": [], "edit": []},
           "cargo_host": {"own_target": [], "shared_target": [], "edit": []}}
    shared_w, shared_c = os.path.join(work, "shared-wisp"), os.path.join(work, "shared-cargo")
    host_size = None
    try:
        # The library OS (and std's crates for the peer) built once in the
        # shared target directories: what "after its first build" means.
        wisp_case(wisp, work, "warmup", shared_w)
        cargo_case(work, "warmuphost", shared_c)
        for i in range(args.runs):
            log("[app] run %d of %d" % (i + 1, args.runs))
            for kind, tdir in (("own_target", None), ("shared_target", shared_w)):
                first, edit = wisp_case(wisp, work, "app%d%s" % (i, kind[:3]), tdir)
                res["wisp"][kind].append(first)
                if kind == "shared_target":
                    res["wisp"]["edit"].append(edit)
            for kind, tdir in (("own_target", None), ("shared_target", shared_c)):
                first, edit, size = cargo_case(work, "host%d%s" % (i, kind[:3]), tdir)
                res["cargo_host"][kind].append(first)
                host_size = size
                if kind == "shared_target":
                    res["cargo_host"]["edit"].append(edit)
        c_src, c_exe = os.path.join(work, "hello.c"), os.path.join(work, "hello-c")
        with open(c_src, "w") as f:
            f.write(HELLO_C)
        subprocess.run(["cc", "-static", "-Os", "-s", "-o", c_exe, c_src], check=True)
        c_size = os.path.getsize(c_exe)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    images = os.path.join(ROOT, "build/images")
    sizes = {n: os.path.getsize(os.path.join(images, n)) for n in sorted(os.listdir(images))}
    med = {p: {k: median(v) for k, v in d.items()} for p, d in res.items()}
    out = {
        "what": "from a new app's crate to its first run (seconds, wall, until the run exits), and image sizes (bytes)",
        "method": __doc__.strip(),
        "runs": args.runs,
        "seconds": res,
        "medians_s": med,
        "image_bytes": sizes,
        "peer_bytes": {"c_static_hello": c_size, "rust_host_hello": host_size},
        "targets": {"first_build_after_libos_s": 30, "hello_bytes": 40 * 1000},
        "ratios": {
            "new_to_run_vs_cargo_host": med["wisp"]["shared_target"] / med["cargo_host"]["shared_target"],
            "edit_to_run_vs_cargo_host": med["wisp"]["edit"] / med["cargo_host"]["edit"],
            "hello_image_vs_static_c": sizes.get("hello", 0) / c_size,
        },
        "machine": machine_info(),
    }
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    log(json.dumps(out["medians_s"], indent=1))
    log(json.dumps(out["ratios"], indent=1))


if __name__ == "__main__":
    main()
