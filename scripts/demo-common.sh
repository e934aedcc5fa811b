# Shared by the demo scripts (sourced; $work is the demo's state).

# The VMM processes' PID namespace outlives a daemon on purpose (for a
# restarted one): its init, of this demo's state, is ended here, and with
# it the pooled shells still in it.
end_pidns() {
    for p in $(pgrep -f -- "__pidns"); do
        tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -q -- "$work" && kill -KILL "$p" 2>/dev/null
    done
    true
}

# wispd of this demo in network namespace $1 (made here, loopback up), its
# bridge wisp0 on subnet $2, a pool of $3; sets $pid and WISP_SOCKET once
# its socket is there.
start_wispd() {
    ip netns add "$1"
    ip netns exec "$1" ip link set lo up
    ip netns exec "$1" "$D" --socket "$work/wispd.sock" --state-dir "$work/state" \
        --subnet "$2" --bridge wisp0 --pool "$3" >"$work/wispd.log" 2>&1 &
    pid=$!
    for _ in $(seq 200); do [ -S "$work/wispd.sock" ] && break; sleep 0.05; done
    export WISP_SOCKET=$work/wispd.sock
}

# What a one-daemon demo leaves, removed (its EXIT trap): the servers it
# started (pids in the array `servers`, if any), its VMs and wispd ($pid),
# the VMM processes' PID namespace, its namespace $ns and directory $work.
end_demo() {
    for s in ${servers[@]+"${servers[@]}"}; do kill "$s" 2>/dev/null || true; done
    [ -n "$pid" ] && WISP_SOCKET=$work/wispd.sock $W rm -f --all >/dev/null 2>&1 || true
    [ -n "$pid" ] && { kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true; }
    end_pidns
    ip netns del "$ns" 2>/dev/null || true
    rm -rf "$work"
}
