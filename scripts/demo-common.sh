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
