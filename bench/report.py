#!/usr/bin/env python3
"""Write docs/benchmarks.md from bench/results/{boot,density,net,fork,cache,app,ab}.json."""

import json
import os
from statistics import median

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)


def load(name):
    with open(os.path.join(BENCH, "results", name)) as f:
        return json.load(f)


def ratio(v):
    return "n/a" if v is None else ("%.4f" % v if v < 0.01 else "%.2f" % v)


# Beside every figure of the Linux-VM peer: it runs under QEMU TCG here.
TCG = " (Linux VM under QEMU TCG)"


def boot_section(b):
    P, r = b["peers"], b["ratios"]
    bd = b["wisp_breakdown"]["components_us"]
    rows = [("wisp", "wisp cold: `wisp run noop` (new process, new KVM VM)"),
            ("wisp_sync_teardown", "wisp cold, VM destroyed before exit (`WISP_SYNC_TEARDOWN=1`)"),
            ("wisp_warm", "wisp warm: `POST /v1/vms?attach=true` (hello) → first line, shell from the pool"),
            ("wisp_api_cold", "wisp via the API with an empty pool (prepare + execute) → first line"),
            ("forkexec", "fork+exec of a static no-op C program"),
            ("forkexec_first_line", "fork+exec of a static C `hello` → its first line on the launcher's pipe"),
            ("container_unshare", "container: `unshare -fpnmiu --mount-proc`"),
            ("container_crun", "container: `crun run`"),
            ("linux_vm", "Linux VM under **QEMU TCG** (software emulation: this host's KVM cannot boot Linux), "
                         "microvm, Debian cloud kernel, busybox initramfs")]
    out = ["## Boot (`make bench-boot`, `bench/results/boot.json`, `boot.png`)", "",
           "Whole-process time from just before `fork()` to just after `waitpid()`, the same C",
           "launcher (`bench/tools/spawntime.c`) for every process peer, %d runs (%d for the Linux" % (b["runs"], b["runs_slow"]),
           "VM under QEMU TCG); the warm rows are API requests to a running `wispd` (request until the guest's",
           "first console line reaches the client). Run of %s:" % b["date"][:16], "",
           "| peer | median | min | p99 |", "|---|---|---|---|"]
    for k, label in rows:
        p = P.get(k, {})
        if "median" not in p:
            out.append("| %s | skipped | | |" % label)
            continue
        m = ("**%.2f ms**" if k.startswith("wisp") else "%.2f ms") % p["median"]
        out.append("| %s | %s | %.2f | %.2f |" % (label, m, p["min"], p["p99"]))
    out += ["", "`ratios` (wisp ÷ peer, below 1 = wisp faster): " +
            ", ".join("`%s` %s%s" % (k, ratio(v), TCG if k.endswith("linux_vm") else "") for k, v in r.items()) + ".", "",
            "Where the cold path's time goes (medians, µs):", "", "| part | µs |", "|---|---|"]
    parts = [("process_start", "process start (fork, exec, dynamic loader, Rust runtime)"),
             ("phase.kvm_create", "KVM VM + vCPU + CPUID"),
             ("phase.memory", "guest RAM (memfd, mmap, memory slot)"),
             ("phase.arch_setup", "GDT/TSS/IDT/page tables, sregs"),
             ("phase.image_load", "image load (segments, leaf page tables)"),
             ("phase.boot_info", "boot-info page, registers"),
             ("phase.guest_init", "guest init (first `KVM_RUN` until the `exit` hypercall)"),
             ("process_teardown", "process teardown (VM destroy handed to a detached child)")]
    out += ["| %s | %.0f |" % (label, bd[k]["median"]) for k, label in parts if k in bd]
    fp = b.get("footprint", {})
    img = fp.get("images_bytes", {})
    out += ["| exits to the monitor | %.0f |" % b["wisp_breakdown"]["exits"]["median"], "",
            "Footprint: `hello` image %s bytes (target ≤ 200 KB), `noop` %s, `sleeper` %s; a running"
            % (img.get("hello"), img.get("noop"), img.get("sleeper")),
            "`sleeper` under `wisp run`: %s KB PSS for its monitor process (target ≤ 2 MB)."
            % fp.get("sleeper", {}).get("pss_kb_median"), ""]
    hops = P.get("wisp_warm", {}).get("hops")
    if hops and "legs" in hops:
        out += ["The warm path by hop (the measured `wisp_warm` runs, %d with a trace, medians, µs; the client's "
                "clock and the toolstack's `boot_trace`, all the host's monotonic clock):" % hops["runs"], "",
                "| hop | µs | what |", "|---|---|---|"]
        out += ["| %s | %.0f | %s |" % (k.replace("_", " "), v, hops["notes"][k]) for k, v in hops["legs"].items()]
        out += ["| whole request, client clock | %.0f | |" % hops["total"]]
    return out


def density_section(d):
    if "modes" not in d:
        return old_density_section(d)
    M = d["modes"]
    names = list(M)
    label = {"process": "a VMM process per VM", "grouped": "grouped (`--vms-per-process %d`)"}

    def col(m):
        return label.get(m, m) % M[m]["vms_per_process"] if "%d" in label.get(m, m) else label.get(m, m)

    def row(what, f, target=""):
        cells = []
        for m in names:
            try:
                cells.append(f(M[m]))
            except (KeyError, TypeError, ZeroDivisionError):
                cells.append("n/a")
        return "| %s | %s | %s |" % (what, " | ".join(cells), target)

    def loaded(r, part):
        v = [x for x in r["boot_us"].get("image_loaded_series", []) if x is not None]
        return median(v[:100] if part == "first" else v[-100:]) / 1e3

    n = d["n_target"]
    out = ["## Density (`make bench-density [N=10000]`, `bench/results/density.json`, `density.png`)", "",
           "`sleeper` VMs (one wake-up a minute, 16 MiB) started one after another through a private `wispd`,",
           "up to N = %d, in each mode in turn (one run, %s). Before each start the pool has refilled (and in" % (n, d["date"][:16]),
           "grouped mode the open group's next VM is prepared: `GET /v1/pool`'s `group_spares`), so the curve shows",
           "a VM's start, without the prepare phase, against the number of VMs already running. Each VM is",
           "created with `POST /v1/vms?wait_line=true`, answered once the guest's first console line has reached",
           "wispd: a VM's boot time (client clock, request to answer) stops at a sign from the guest itself.", "",
           "| metric | %s | target |" % " | ".join(col(m) for m in names),
           "|---|%s---|" % ("---|" * len(names)),
           row("VMs reached", lambda r: "%d" % r["n_reached"]),
           row("boot time (request → first console line), first 100 VMs, median", lambda r: "%.2f ms" % (r["boot_us"]["first_100_median"] / 1e3)),
           row("boot time, last 100 VMs, median", lambda r: "%.2f ms" % (r["boot_us"]["last_100_median"] / 1e3)),
           row("of which: execute phase in the VMM process (image loaded), first / last 100", lambda r: "%.2f / %.2f ms" % (loaded(r, "first"), loaded(r, "last"))),
           row("`last_vs_first_boot`", lambda r: "%.2f" % r["ratios"]["last_vs_first_boot"], "≤ 1.2"),
           row("boot time p99", lambda r: "%.2f ms" % (r["boot_us"]["p99"] / 1e3))]
    for k in ["1000", str(n)]:
        out.append(row("host memory per VM (MemAvailable drop ÷ VMs) at %s" % k, lambda r: "%.0f KB" % r["mem_per_vm_kb"][k], "≤ 1,024 KB (moonshot 512)"))
    for k in ["SUnreclaim", "AnonPages", "SReclaimable", "KernelStack", "PageTables", "Mapped"]:
        out.append(row("of which `%s` per VM at %d (`/proc/meminfo` growth ÷ VMs)" % (k, n), lambda r: "%.0f KB" % r["meminfo_per_vm_kb"][k]))
    out += [row("VMM processes / tasks per VM (threads and KVM's kernel task)", lambda r: "%d / %.2f" % (r["vmm_processes"], r["tasks_per_vm"])),
            row("CPU used by wisp (wispd, VMM processes, all their tasks) while all idle", lambda r: "%.2f %%" % r["idle_cpu_percent_wisp"], "≤ 5 %"),
            row("the kernel's DAMON thread (`kdamond.0`) meanwhile, % of one core", lambda r: "%.1f %%" % r["kdamond_cpu_percent_of_a_core"]),
            row("whole-host CPU while all idle", lambda r: "%.1f %%" % r["idle_cpu_percent"]),
            row("pause, API round trip, median / p99", lambda r: "%.0f / %.0f µs" % (r["pause_us"]["median"], r["pause_us"]["p99"]), "≤ 100 µs"),
            row("resume, median / p99", lambda r: "%.0f / %.0f µs" % (r["resume_us"]["median"], r["resume_us"]["p99"]), "≤ 100 µs"),
            row("removing all VMs (`wisp rm -f --all`: batches of 256)", lambda r: "%.1f s" % r["remove_all_s"], "≤ 10 s"),
            ""]
    return out


def old_density_section(d):
    bu = d["boot_us"]
    if bu.get("stop") == "first_line":
        stop = "request → first console line"
        how = ["Each VM is created with `POST /v1/vms?wait_line=true`, which wispd answers once the guest's",
               "first console line has reached it: a VM's boot time (client clock, request to answer) stops",
               "at a sign from the guest itself."]
    else:
        stop = "request → image loaded"
        how = ["This run predates `wait_line`: each VM was created with a plain `POST /v1/vms`, answered once",
               "the image was loaded and before the guest had run, so its boot times stop there, short of the",
               "guest's first instruction (`bench/density.py` now stops every VM's clock at its first console",
               "line; not yet re-run on a quiet host)."]
    out = ["## Density (`make bench-density [N=10000]`, `bench/results/density.json`, `density.png`)", "",
           "`sleeper` VMs (one wake-up a minute) started one after another through a private `wispd`",
           "(pool of %d), up to N = %d (reached: %d). Before each start the pool is allowed to refill,"
           % (d["pool"], d["n_target"], d["n_reached"]),
           "so the curve shows a VM's start, without the pool's prepare phase, against the number of VMs",
           "already running."] + how + [
           "Run of %s:" % d["date"][:16], "",
           "| metric | value | target |", "|---|---|---|",
           "| boot time, first 100 VMs (%s), median | %.2f ms | |" % (stop, bu["first_100_median"] / 1e3),
           "| boot time, last 100 VMs, median | %.2f ms | |" % (bu["last_100_median"] / 1e3)]
    loaded = [v for v in bu.get("image_loaded_series", []) if v is not None]
    if loaded:
        out.append("| of which: execute phase in the VMM process (image loaded), first / last 100 VMs, median "
                   "| %.2f / %.2f ms | |" % (median(loaded[:100]) / 1e3, median(loaded[-100:]) / 1e3))
    out += ["| `ratios.last_vs_first_boot` | %.2f | ≤ 1.2 |" % d["ratios"]["last_vs_first_boot"]]
    for n, kb in sorted(d["mem_per_vm_kb"].items(), key=lambda x: int(x[0])):
        out.append("| host memory per VM (MemAvailable drop ÷ VMs) at %s | %.0f KB | ≤ 1 MB |" % (n, kb))
    out += ["| CPU used by wisp (wispd, VMM processes, their KVM kernel tasks) while all idle | %.2f %% | ≤ 5 %% |"
            % d["idle_cpu_percent_wisp"],
            "| whole-host CPU while all idle | %.1f %% (%.1f %% before the run) | |"
            % (d["idle_cpu_percent"], d["idle_cpu_percent_before"]),
            "| pause, API round trip, median / p99 | %.0f / %.0f µs | ≤ 100 µs |" % (d["pause_us"]["median"], d["pause_us"]["p99"]),
            "| resume, median / p99 | %.0f / %.0f µs | ≤ 100 µs |" % (d["resume_us"]["median"], d["resume_us"]["p99"]),
            "| removing all %d VMs | %.0f s | |" % (d["n_reached"], d["remove_all_s"]), ""]
    return out


NET_ENVS = [("wisp", "wisp"), ("container", "container"), ("native", "native"),
            ("linux_vm", "Linux VM (QEMU TCG)")]


def net_section(n):
    E = n["environments"]
    envs = [e for e, _ in NET_ENVS if e in E and "tcp" in E[e]]
    head = dict(NET_ENVS)
    cols = " | ".join(head[e] for e in envs)
    sep = "|---|" + "---|" * len(envs)
    sizes = sorted({int(k) for e in envs for k in E[e]["tcp"]})
    hl = n.get("host_load", {})
    other = hl.get("other_cpu_pct")
    quiet = ("" if other is None else
             " Other processes on the host used %.1f %% of its CPUs during the run%s." % (
                 other, " (by phase: %s)" % ", ".join("%s %.0f %%" % kv for kv in hl.get("other_cpu_pct_by_phase", {}).items())
                 if other >= 2 else ""))
    out = ["## Network study (`make bench-net`, `bench/results/net.json`, `net-tcp.png`, `net-udp.png`, "
           "`net-window.png`, `net-rr.png`, `net-ping.png`)", "",
           "All inside one network namespace the benchmark creates: wisp (the `iperf` and `echo` apps, one VM",
           "each, on taps), a container (servers in a child namespace behind a veth pair), native (servers on",
           "the namespace's loopback) and a Linux VM — **QEMU TCG** (software emulation: KVM on this host cannot",
           "boot a stock Linux kernel), microvm, Debian cloud kernel, virtio-net, servers in the initramfs.",
           "Throughput: the host's `iperf3` client. Request/response: one compiled client (`bench/echo/rrclient.c`)",
           "for every peer; the server is wisp's guest `echo` app for wisp and one compiled echo server",
           "(`bench/echo/echosrv.c`, static) for all the others. Run of %s%s." % (
               n["date"][:16], "") + quiet, "",
           "Targets for the data-path work, measured in this run (wisp ÷ peer unless said otherwise):", "",
           "| ratio | measured | target | |", "|---|---|---|---|"]
    for k, t in n.get("targets", {}).items():
        v = t["value"]
        shown = "n/a" if v is None else ("+%.1f points" % v if k == "udp_small_loss_pct" else ratio(v))
        out.append("| `%s` | %s | %s | %s |" % (k, shown, t["target"],
                                               {True: "met", False: "**missed**", None: "not measured"}[t["met"]]))
    out += ["", "TCP stream throughput (Gbit/s) against message size (`-l`), one stream, and 64 KiB over four (`-P 4`):", "",
            "| size | " + cols + " |", sep]
    gb = lambda v: "%.2f" % v["gbps"] if v and v.get("gbps") is not None else "-"  # noqa: E731
    for sz in sizes:
        out.append("| %d | %s |" % (sz, " | ".join(gb(E[e]["tcp"].get(str(sz))) for e in envs)))
    p4 = sorted({k for e in envs for k in E[e].get("tcp_p4", {})}, key=int)
    for k in p4:
        out.append("| %d, `-P 4` | %s |" % (int(k), " | ".join(gb(E[e].get("tcp_p4", {}).get(k)) for e in envs)))
    udp = sorted({int(k) for e in envs for k in E[e].get("udp", {})})
    out += ["", "UDP at 200 Mbit/s offered, received throughput (Gbit/s) / loss (%) against datagram size:", "",
            "| size | " + cols + " |", sep]
    for sz in udp:
        cells = []
        for e in envs:
            v = E[e].get("udp", {}).get(str(sz))
            cells.append("%.3f / %.1f" % (v["gbps"], v["loss_pct"]) if v and v.get("gbps") is not None else "-")
        out.append("| %d | %s |" % (sz, " | ".join(cells)))
    us = lambda v, k: "%.0f" % v[k] if v and v.get(k) is not None else "-"  # noqa: E731
    out += ["", "TCP request/response round trip (µs), pooled over the rounds:", "",
            "| | " + cols + " |", sep,
            "| server | " + " | ".join("guest `echo` app" if e == "wisp" else "`echosrv`" for e in envs) + " |"]
    for sz in sorted({int(k) for e in envs for k in E[e].get("rr", {})}):
        for key, name in (("p50_us", "p50"), ("p90_us", "p90"), ("p99_us", "p99"), ("min_us", "min")):
            out.append("| %s, %s | %s |" % ("1 B" if sz == 1 else "%d B" % sz, name,
                                            " | ".join(us(E[e].get("rr", {}).get(str(sz)), key) for e in envs)))
        out.append("| %s, p50 of each round | %s |" % ("1 B" if sz == 1 else "%d B" % sz, " | ".join(
            "/".join("%.0f" % x for x in E[e].get("rr", {}).get(str(sz), {}).get("round_p50_us", [])) or "-"
            for e in envs)))
    out += ["", "Ping from the namespace (µs): back to back (`-A`, average), idle and busy (one echo every",
            "0.1 s, median / p99):", "",
            "| | " + cols + " |", sep,
            "| back to back, avg | %s |" % " | ".join(us(E[e].get("ping"), "avg_us") for e in envs),
            "| idle | %s |" % " | ".join("%s / %s" % (us(E[e].get("ping_idle"), "median_us"), us(E[e].get("ping_idle"), "p99_us"))
                                       for e in envs),
            "| busy (1-byte request/response loop running) | %s |" % " | ".join(
                "%s / %s" % (us(E[e].get("ping_busy"), "median_us"), us(E[e].get("ping_busy"), "p99_us")) for e in envs)]
    rs = []
    for k, v in n["ratios"].items():
        if isinstance(v, dict):
            def losses(d):
                return ", ".join("%s B %.1f %%" % (s, x) for s, x in d.items() if x is not None)
            rs.append("`%s` wisp %s; container %s" % (k, losses(v.get("wisp", {})), losses(v.get("container", {}))))
        else:
            rs.append("`%s` %s%s" % (k, ratio(v), TCG if k.endswith("linux_vm") else ""))
    out += ["", "`ratios`: " + ", ".join(rs) + ".", ""]
    return out


def fork_section(k):
    w, u = k["peers"]["wisp"]["median_ns"], k["peers"]["unix"]["median_ns"]
    rows = [("fork", "fork (until it returns in the parent)", "fork_vs_process_fork"),
            ("fork_exit_wait", "fork + child exits + parent waits", "wait_vs_unix"),
            ("pipe", "pipe round trip (1 byte each way)", "pipe_vs_unix"),
            ("msgq", "message queue round trip", "msgq_vs_unix"),
            ("kill", "kill round trip (signal, signal back)", "kill_vs_unix"),
            ("shm", "shared-memory round trip (spinning on a word)", "shm_vs_unix")]
    fmt = lambda ns: "%.1f µs" % (ns / 1e3) if ns >= 1000 else "%d ns" % ns
    out = ["## Fork and family IPC (`make bench-fork`, `bench/results/fork.json`, `fork.png`)", "",
           "KylinX's Table 3 side by side in one run: a VM and its forked child VM (`family bench`,",
           "direct mode) against a process and its forked child (`bench/tools/ipcbench.c`), same",
           "method, %d round trips per measurement, median of %d alternating repetitions, run of %s:" % (
               k["rounds"], k["reps"], k["date"][:16]), "",
           "| measurement | wisp VMs | UNIX processes | ratio |", "|---|---|---|---|"]
    for key, label, r in rows:
        out.append("| %s | %s | %s | `%s` %s |" % (label, fmt(w[key]), fmt(u[key]), r, ratio(k["ratios"][r])))
    out += [""]
    return out


def ab_section(a):
    s = a["summary"]
    out = ["## Before and after a change (`bench/ab.py`, `bench/results/ab.json`)", "",
           "The same benchmarks on two builds, alternating before (%s) and after (%s) in one run, %d rounds;" % (
               a["before"]["commit"], a["after"]["commit"], len(a["rounds"])),
           "the median of the rounds' medians, and after/before (fork+exec is the host's noise reference):", "",
           "| figure | before | after | after/before |", "|---|---|---|---|"]
    for k, v in s.items():
        unit = "ms" if k.endswith("_ms") else "µs"
        name = k.rsplit("_", 1)[0]
        out.append("| %s | %.3f %s | %.3f %s | %s |" % (name, v["before"], unit, v["after"], unit, ratio(v["after_vs_before"])))
    return out + [""]


def cache_section(c):
    r, t = c["ratios"], c["targets"]
    peers = [("wisp_cache", "cache VM"), ("nginx_native", "nginx native"), ("nginx_container", "nginx container")]
    out = ["## The content cache (`make bench-cache`, `bench/results/cache.json`, `cache.png`)", "",
           "wrk (one thread, %d s a point) against the cache VM (its address on the bridge, over its tap), nginx on" % c["seconds_per_point"],
           "loopback (\"native\", one worker as the VM has one vCPU) and nginx in a namespace container (own network,",
           "mount and PID namespaces, a veth pair), all in a namespace of the benchmark's own, the same objects", "by name.", "",
           "| object, connections | cache VM req/s (p99) | nginx native | nginx container |", "|---|---|---|---|"]
    for k in c["rps"]["wisp_cache"]:
        cells = ["%.0f (%.2f ms)" % (c["rps"][p][k]["rps"], c["rps"][p][k]["p99_ms"]) for p, _ in peers]
        out.append("| %s | %s |" % (k.replace("_c", ", "), " | ".join(cells)))
    met = lambda v, goal, up=True: "met" if (v >= goal if up else v <= goal) else "**missed**"  # noqa: E731
    thr = c["throughput_256mb_gbit"]
    fb, pss = c["first_byte_after_run_ms"]["median"], c["idle_cache_vm_pss_kb"]
    out += ["", "| figure | value | target | |", "|---|---|---|---|",
            "| `rps_0b_vs_nginx_native` (best of the connection counts each) | %s | ≥ %.1f | %s |" % (ratio(r["rps_0b_vs_nginx_native"]), t["rps_0b_vs_nginx_native"], met(r["rps_0b_vs_nginx_native"], t["rps_0b_vs_nginx_native"])),
            "| `rps_0b_vs_nginx_container` | %s | ≥ %.1f | %s |" % (ratio(r["rps_0b_vs_nginx_container"]), t["rps_0b_vs_nginx_container"], met(r["rps_0b_vs_nginx_container"], t["rps_0b_vs_nginx_container"])),
            "| `throughput_100kb_vs_nginx_native` (100 KB objects, best connection count) | %s | ≥ %.1f | %s |" % (ratio(r["throughput_100kb_vs_nginx_native"]), t["throughput_100kb_vs_nginx_native"], met(r["throughput_100kb_vs_nginx_native"], t["throughput_100kb_vs_nginx_native"])),
            "| `throughput_vs_nginx_native` (256 MB object: %.1f vs %.1f Gbit/s; container %.1f) | %s | — | |" % (thr["wisp_cache"], thr["nginx_native"], thr["nginx_container"], ratio(r["throughput_vs_nginx_native"])),
            "| first byte after `wisp run` (median of %d: `wisp run -d` %.1f ms, the address from the API %.1f, then to the first byte %.1f) | %.1f ms | ≤ %d ms | %s |" % (
                len(c["first_byte_after_run_ms"]["runs"]), c["first_byte_after_run_ms"].get("wisp_run_d_ms", 0), c["first_byte_after_run_ms"].get("address_from_api_ms", 0),
                c["first_byte_after_run_ms"].get("then_to_first_byte_ms", 0), fb, t["first_byte_ms"], met(fb, t["first_byte_ms"], False)),
            "| host memory of an idle cache VM (PSS of its VMM process) | %d KB | ≤ %d KB | %s |" % (pss, t["idle_pss_kb"], met(pss, t["idle_pss_kb"], False)),
            ""]
    if "aggregate_rps_0b" in c:
        out += ["Several cache VMs on one read-only volume, one wrk each at once (0 B, 50 connections each; the host has %s CPUs):" % c["machine"].get("nproc", "?"), "",
                "| cache VMs | requests/s together |", "|---|---|"]
        out += ["| %s | %.0f |" % (n, v) for n, v in c["aggregate_rps_0b"].items()] + [""]
    return out


def cdnsim_section(c):
    r, t = c["ratios"], c["targets"]
    one_m = [x for x in c["runs"] if x["viewers"] == 1_000_000][0]
    out = ["## CDNSim (`make bench-cdnsim`, `bench/results/cdnsim.json`, `cdnsim.png`)", "",
           "The simulator on a 1,000-AS graph of its generator (`%s`), caches booting in 1 s:" % c["topology"], "",
           "| viewers | wall | peak memory | events | events/s | peak watching | peak caches |", "|---|---|---|---|---|---|---|"]
    coop = [dict(x, viewers="%d, cooperative" % x["viewers"]) for x in c.get("cooperative_runs", [])]
    for x in c["runs"] + coop + [dict(c["naive"], viewers="%d, naive" % c["naive"]["viewers"])]:
        out.append("| %s | %.2f s | %.0f MB | %d | %.0f | %d | %d |" % (x["viewers"], x["wall_s"], x["peak_rss_mb"], x["events"], x["events_per_s"], x["peak_viewers"], x["peak_caches"]))
    met = lambda v, goal: "met" if v <= goal else "**missed**"  # noqa: E731
    out += ["", "| figure | value | target | |", "|---|---|---|---|",
            "| 1M viewers, wall | %.0f s | ≤ %d s (moonshot %d s) | %s |" % (one_m["wall_s"], t["wall_s_1m"], t["moonshot_wall_s_1m"], met(one_m["wall_s"], t["wall_s_1m"])),
            "| 1M viewers, peak memory | %.0f MB | ≤ %d MB | %s |" % (one_m["peak_rss_mb"], t["peak_rss_mb_1m"], met(one_m["peak_rss_mb"], t["peak_rss_mb_1m"])),
            "| `speedup_vs_naive` (wall time of the same 10,000 viewers) | %s | — | |" % ratio(r["speedup_vs_naive"]),
            "| events/s against the naive run | %s | — | |" % ratio(r["events_per_s_vs_naive"]), "",
            "The boot-time sweep (%d viewers; the last row is wisp's cache VM, its first byte after `wisp run` in `cache.json`):" % c["sweep"]["viewers"], "",
            "| boot time | start-up delay mean | p90 | p99 | buffering ratio mean | buffering events mean | playback ratio mean |", "|---|---|---|---|---|---|---|"]
    for x in c["sweep"]["runs"]:
        out.append("| %.4g s%s | %.3f s | %.3f s | %.3f s | %.5f | %.3f | %.3f |" % (
            x["boot_time_s"], " (wisp)" if x.get("wisp") else "", x["startup_delay_s"]["mean"], x["startup_delay_s"]["p90"],
            x["startup_delay_s"]["p99"], x["buffering_ratio"]["mean"], x["buffering_events"]["mean"], x["playback_ratio"]["mean"]))
    return out + ["", "![start-up delay's CDF per boot time, drawn by cdnsim sweep](../bench/results/cdnsim-sweep-cdf.png)", ""]


def snapshot_section(s):
    r, t = s["ratios"], s["targets"]
    out = ["## Snapshots (`make bench-snapshot`, `bench/results/snapshot.json`, `snapshot.png`)", "",
           "A 16 MiB `counter` VM saved and restored through wispd's API while N idle VMs run (client clock, median of %d;"
           " the stop points in `bench/snapshot.py`): save until the file is written and sealed, and the time the VM was"
           " held; restore and a warm boot of the same image until the answer, which both get at the guest's first exit." % s.get("reps", 15), "",
           "| VMs running | save | VM held | restore | from a template | warm boot | restore ÷ warm boot | migrate | its downtime | snapshot |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    opt = lambda x, k: "%.2f ms" % x[k]["median"] if k in x else "—"  # noqa: E731
    for x in s["by_vms"]:
        out.append("| %d | %.2f ms | %.2f ms | %.2f ms | %s | %.2f ms | %.2f | %s | %s | %d KiB |" % (
            x["vms"], x["save_ms"]["median"], x["held_ms"]["median"], x["restore_ms"]["median"], opt(x, "template_ms"),
            x["warm_boot_ms"]["median"], x["restore_ms"]["median"] / x["warm_boot_ms"]["median"], opt(x, "migrate_ms"),
            opt(x, "migrate_downtime_ms"), x["snapshot_bytes"] >> 10))
    met = lambda v, goal: "met" if v <= goal else "**missed**"  # noqa: E731
    out += ["", "| figure (the worst median over N) | value | target | LightVM | |", "|---|---|---|---|---|",
            "| `save_ms` | %.2f ms | ≤ %d ms | %d ms | %s |" % (r["save_ms"], t["save_ms"], t["lightvm_save_ms"], met(r["save_ms"], t["save_ms"])),
            "| `restore_ms` | %.2f ms | ≤ %d ms | %d ms | %s |" % (r["restore_ms"], t["restore_ms"], t["lightvm_restore_ms"], met(r["restore_ms"], t["restore_ms"])),
            "| `restore_vs_warm_boot` | %s | — | — | |" % ratio(r["restore_vs_warm_boot"]),
            "| `template_vs_warm_boot` | %s | — | — | |" % ratio(r.get("template_vs_warm_boot")),
    ]
    if "template_vs_fork" in r:
        out.append("| `template_vs_fork` (a VM's own fork: %.3f ms, guest clock until fork returns; not the template start's"
                   " stop points: no API, no daemon) | %s | — | — | |" % (s["fork_ms"]["median"], ratio(r["template_vs_fork"])))
    if "migrate_ms" in r:
        out += ["| `migrate_ms` (to a second daemon over the loopback) | %.2f ms | ≤ %d ms | %d ms | %s |" % (
                    r["migrate_ms"], t["migrate_ms"], t["lightvm_migrate_ms"], met(r["migrate_ms"], t["migrate_ms"])),
                "| `migrate_downtime_ms` | %.2f ms | ≤ %d ms | — | %s |" % (
                    r["migrate_downtime_ms"], t["migrate_downtime_ms"], met(r["migrate_downtime_ms"], t["migrate_downtime_ms"]))]
    else:
        out.append("| `migrate_ms`, `migrate_downtime_ms` | not measured | ≤ 10 ms, ≤ 2 ms | 60 ms | |")
    out.append("")
    return out


def app_section(a):
    m, r, sz, peer = a["medians_s"], a["ratios"], a["image_bytes"], a["peer_bytes"]
    w, c = m["wisp"], m["cargo_host"]
    out = ["## Writing an app (`make bench-app`, `bench/results/app.json`)", "",
           "From a new app's crate to its first run, wall seconds until the run exits (median of %d):" % a["runs"],
           "`wisp new NAME` + `wisp run ./NAME` (cargo for the guest target, then the VM boots in this process),",
           "against the host Rust equivalent, `cargo new NAME` + `cargo run --release` of the same hello.",
           "\"After the library OS's first build\" shares a target directory in which it was built once;",
           "\"edit\" is one line of `src/main.rs` changed, then the same run command.", "",
           "| case | wisp | cargo (host) | wisp ÷ cargo |", "|---|---|---|---|",
           "| first build, own target directory (the library OS compiled too) | %.1f s | %.1f s | %s |" % (
               w["own_target"], c["own_target"], ratio(w["own_target"] / c["own_target"])),
           "| first build after the library OS's first build (target: under 30 s) | %.1f s | %.1f s | `new_to_run_vs_cargo_host` %s |" % (
               w["shared_target"], c["shared_target"], ratio(r["new_to_run_vs_cargo_host"])),
           "| edit, then run | %.1f s | %.1f s | `edit_to_run_vs_cargo_host` %s |" % (
               w["edit"], c["edit"], ratio(r["edit_to_run_vs_cargo_host"])),
           "", "Image sizes (bytes; target: `hello` at most 40 KB), against a static C hello (`cc -static -Os -s`) "
           "and the host Rust hello (release, LTO, stripped):", "",
           "| image | bytes |", "|---|---|"]
    for n, b in sz.items():
        out.append("| `%s` | %d |" % (n, b))
    out += ["| static C hello (peer) | %d |" % peer["c_static_hello"],
            "| host Rust hello (peer) | %d |" % peer["rust_host_hello"], "",
            "`hello_image_vs_static_c` = %s." % ratio(r["hello_image_vs_static_c"]), ""]
    return out


def main():
    head = open(os.path.join(BENCH, "report-notes.md")).read()
    b, d = load("boot.json"), load("density.json")
    parts = head.split("<!-- density -->")
    text = parts[0].replace("<!-- boot -->", "\n".join(boot_section(b))) + "\n".join(density_section(d)) + parts[1]
    # Each further section at its marker in the notes (else at the end),
    # if its results exist.
    for name, section in (("net", net_section), ("fork", fork_section), ("cache", cache_section),
                          ("cdnsim", cdnsim_section), ("snapshot", snapshot_section), ("app", app_section), ("ab", ab_section)):
        if os.path.exists(os.path.join(BENCH, "results", name + ".json")):
            sec = "\n".join(section(load(name + ".json")))
            marker = "<!-- %s -->" % name
            text = text.replace(marker, sec) if marker in text else text + "\n" + sec
    with open(os.path.join(ROOT, "docs", "benchmarks.md"), "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
