#!/usr/bin/env bash
# wisp as an OCI runtime in one command (`make demo-oci`): the daytime and
# hello wisp images packed as OCI images (podman import), run by podman
# with wisp-oci as its runtime: hello's output and exit status, daytime
# detached with a port published on loopback and read through it, podman
# ps/logs/stop. Everything is removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
R=$PWD/target/release/wisp-oci
work=$(mktemp -d)
tag=wisp-demo-oci-$$
ids=()
end() {
    for i in ${ids[@]+"${ids[@]}"}; do podman rm -f "$i" >/dev/null 2>&1 || true; done
    podman rmi -f "localhost/$tag-hello" "localhost/$tag-daytime" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap end EXIT
P=(podman --runtime "$R")
RUN=(run --pull=never --ulimit nofile=1024:1024 --ulimit nproc=1024:1024)
for app in hello daytime; do
    mkdir -p "$work/$app/wisp" && cp "build/images/$app" "$work/$app/wisp/image"
    tar -C "$work/$app" -c . | podman import --quiet --change 'ENTRYPOINT ["/wisp/image"]' - "localhost/$tag-$app" >/dev/null
done
echo "== podman run --rm -m 32m hello a b (a VM; the memory limit is its RAM)"
"${P[@]}" "${RUN[@]}" --rm -m 32m "localhost/$tag-hello" a b
echo "== podman run -d -p 127.0.0.1:10013:13 daytime"
id=$("${P[@]}" "${RUN[@]}" -d -p 127.0.0.1:10013:13 "localhost/$tag-daytime")
ids+=("$id")
for _ in $(seq 200); do "${P[@]}" logs "$id" 2>/dev/null | grep -q listening && break; sleep 0.05; done
"${P[@]}" ps --filter "id=$id" --format '{{.ID}} {{.Image}} {{.Status}} {{.Ports}}'
echo "== the time, from the VM, through podman's published port"
python3 -c "import socket; s = socket.create_connection(('127.0.0.1', 10013), timeout=5); print(s.recv(100).decode().strip())"
echo "== podman logs"
"${P[@]}" logs "$id"
echo "== podman stop: the VM's process ends on SIGTERM"
"${P[@]}" stop -t 5 "$id" >/dev/null
echo "exit code $("${P[@]}" inspect "$id" --format '{{.State.ExitCode}}')"
