# shellcheck shell=bash
# Shared functions for .ci/setup and .ci/brokers (sourced, never executed).
#
# Three RabbitMQ brokers for the test suite:
#   rmq310  Debian bookworm's rabbitmq-server 3.10.8 on this machine, node rabbit@$(hostname -s)
#           AMQP 5672, AMQPS 5671, management 15672 / HTTPS 15671, stream 5552
#   rmq40   Debian trixie's rabbitmq-server 4.0.5 in a debootstrap chroot, node rabbit4@localhost
#           AMQP 5673, management 15673, stream 5553, Erlang distribution 25673
#   rmq43   Debian sid's rabbitmq-server 4.3.x in a debootstrap chroot, node rabbit43@localhost
#           AMQP 5674, management 15674, stream 5554, Erlang distribution 25674
# All use guest/guest (guest may log in from localhost only, which is all we need).

RBAK_CI_DIR=${RBAK_CI_DIR:-/var/lib/rbak-ci}
RBAK_CI_TLS_DIR=${RBAK_CI_TLS_DIR:-$RBAK_CI_DIR/tls}
RBAK_CI_CHROOT=${RBAK_CI_CHROOT:-$RBAK_CI_DIR/trixie}
RBAK_CI_CHROOT43=${RBAK_CI_CHROOT43:-$RBAK_CI_DIR/sid}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-}
export DEBIAN_FRONTEND=noninteractive

# The chroot brokers, one line each: name suite chroot node amqp mgmt stream dist.
CHROOT_BROKERS=(
    "rmq40 trixie $RBAK_CI_CHROOT rabbit4@localhost 5673 15673 5553 25673"
    "rmq43 sid $RBAK_CI_CHROOT43 rabbit43@localhost 5674 15674 5554 25674"
)
# shellcheck disable=SC2034 # used by .ci/brokers
ALL_BROKERS=(rmq310 rmq40 rmq43)

log() { printf '[ci %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# step NAME CMD...: run CMD, print its wall time; abort the script when it fails.
step() {
    local name=$1 start rc=0
    shift
    start=$(date +%s)
    log "==> $name"
    # A subshell outside any ||/&& context, so `set -e` really applies inside CMD
    # (bash ignores -e in functions called as `f || ...`).
    set +e
    (
        set -e
        "$@"
    )
    rc=$?
    set -e
    if [ "$rc" -ne 0 ]; then die "step '$name' failed (exit $rc) after $(($(date +%s) - start))s"; fi
    log "<== $name: $(($(date +%s) - start))s"
}

# wait_for SECONDS DESCRIPTION CMD...: poll CMD once a second until it succeeds.
wait_for() {
    local limit=$1 what=$2 i
    shift 2
    for ((i = 0; i < limit; i++)); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 1
    done
    log "timed out after ${limit}s waiting for $what"
    return 1
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

mgmt_ok() { # mgmt_ok PORT: the management API answers with an overview
    curl -fsS -m 5 -u guest:guest "http://127.0.0.1:$1/api/overview" >/dev/null
}

mgmt_version() { # prints rabbitmq_version from the management API
    curl -fsS -m 5 -u guest:guest "http://127.0.0.1:$1/api/overview" |
        sed -n 's/.*"rabbitmq_version":"\([^"]*\)".*/\1/p'
}

# ---------------------------------------------------------------- TLS material
# ca.pem/ca.key           CA that signed the server and client certs (trusted by rmq310)
# server.pem/server.key   CN=localhost, SAN localhost, 127.0.0.1, $(hostname)
# client.pem/client.key   CN=guest, signed by ca
# wrong-ca.pem/.key       an unrelated CA (nothing it signs is trusted)
# wrong-client.pem/.key   CN=guest, signed by wrong-ca (the broker must reject it)
tls_valid() {
    local d=$RBAK_CI_TLS_DIR f
    for f in ca server client wrong-ca wrong-client; do
        [ -s "$d/$f.pem" ] && [ -s "$d/$f.key" ] || return 1
    done
    openssl x509 -checkend 604800 -noout -in "$d/server.pem" >/dev/null &&
        openssl verify -CAfile "$d/ca.pem" "$d/server.pem" "$d/client.pem" >/dev/null
}

_tls_ca() { # _tls_ca NAME CN
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -sha256 \
        -keyout "$1.key" -out "$1.pem" -subj "/O=rbak-ci/CN=$2" \
        -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
}

_tls_leaf() { # _tls_leaf NAME CA CN EXTFILE-CONTENT
    openssl req -new -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "/O=rbak-ci/CN=$3" 2>/dev/null
    printf '%s\n' "$4" >"$1.ext"
    openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" -CAcreateserial -days 3650 -sha256 \
        -extfile "$1.ext" -out "$1.pem" 2>/dev/null
    rm -f "$1.csr" "$1.ext"
}

tls_generate() {
    if tls_valid; then
        log "TLS material in $RBAK_CI_TLS_DIR is present and valid; keeping it"
        return 0
    fi
    local tmp host
    host=$(hostname)
    tmp=$(mktemp -d "$RBAK_CI_DIR/tls.XXXXXX")
    (
        set -e
        cd "$tmp"
        _tls_ca ca "rbak-ci CA"
        _tls_ca wrong-ca "rbak-ci unrelated CA"
        _tls_leaf server ca localhost "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=DNS:localhost,IP:127.0.0.1,DNS:$host"
        _tls_leaf client ca guest "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
        _tls_leaf wrong-client wrong-ca guest "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
        rm -f ./*.srl
        # Throwaway test keys: world-readable so the rabbitmq user and the tests can read them.
        chmod 0644 ./*.pem ./*.key
    ) || { rm -rf "$tmp"; return 1; }
    chmod 0755 "$tmp"
    rm -rf "$RBAK_CI_TLS_DIR"
    mv "$tmp" "$RBAK_CI_TLS_DIR"
    tls_valid || { log "generated TLS material does not verify"; return 1; }
    log "generated TLS material in $RBAK_CI_TLS_DIR"
}

# ---------------------------------------------------------------- rmq310 (host)
rmq310_config() {
    local d=$RBAK_CI_TLS_DIR
    cat <<EOF
# Written by rbak .ci/setup; rerunning it rewrites this file.
listeners.tcp.default = 5672
listeners.ssl.default = 5671
ssl_options.cacertfile = $d/ca.pem
ssl_options.certfile = $d/server.pem
ssl_options.keyfile = $d/server.key
ssl_options.verify = verify_peer
ssl_options.fail_if_no_peer_cert = false
management.tcp.port = 15672
management.ssl.port = 15671
management.ssl.cacertfile = $d/ca.pem
management.ssl.certfile = $d/server.pem
management.ssl.keyfile = $d/server.key
stream.listeners.tcp.1 = 5552
stream.advertised_host = localhost
stream.advertised_port = 5552
# Queue stats in the management API refresh every second (default 5 s) so tests wait less.
collect_statistics_interval = 1000
EOF
}

rmq310_running() { rabbitmqctl -q status >/dev/null 2>&1; }
rmq310_ready() { mgmt_ok 15672 && port_open 5672 && port_open 5671 && port_open 5552; }

# Writes /etc/rabbitmq/rabbitmq.conf + enabled plugins; prints "changed" when the
# config file content differs from what was there.
rmq310_configure() {
    local want
    want=$(rmq310_config)
    install -d /etc/rabbitmq
    if [ "$(cat /etc/rabbitmq/rabbitmq.conf 2>/dev/null)" != "$want" ]; then
        printf '%s\n' "$want" >/etc/rabbitmq/rabbitmq.conf
        echo changed
    fi
    # rabbitmq-plugins --offline only edits the enabled_plugins file.
    if ! grep -q rabbitmq_stream /etc/rabbitmq/enabled_plugins 2>/dev/null ||
        ! grep -q rabbitmq_management /etc/rabbitmq/enabled_plugins 2>/dev/null; then
        rabbitmq-plugins --offline enable rabbitmq_management rabbitmq_stream >/dev/null
        echo changed
    fi
    nofile_configure ""
}

# Debian's systemd unit gives RabbitMQ 65536 open files (LimitNOFILE). Started by
# `rabbitmq-server -detached`, which runs the node through `su rabbitmq`, it got a soft
# limit of 1024 here: 4.3.6 filling 1,000 classic queues ran out (emfile in
# rabbit_classic_queue_store_v2), crashed those queue processes and left the management API
# answering 500. su's pam_limits applies this file; it can only give up to our own hard
# limit (20000 in this sandbox, where even root may not raise it), and a value above it
# is ignored whole, so the file asks for the smaller of the two.
nofile_configure() { # nofile_configure ROOT: prints "changed" when the limits file was (re)written
    local f="$1/etc/security/limits.d/rbak-rabbitmq.conf" n want
    n=$(ulimit -Hn)
    if [ "$n" = unlimited ] || [ "$n" -gt 65536 ]; then n=65536; fi
    want="# Written by rbak .ci/setup: up to what Debian's systemd unit gives RabbitMQ (LimitNOFILE 65536).
rabbitmq - nofile $n"
    if [ "$(cat "$f" 2>/dev/null)" != "$want" ]; then
        install -d "$(dirname "$f")"
        printf '%s\n' "$want" >"$f"
        echo changed
    fi
}

rmq310_start() {
    local changed
    changed=$(rmq310_configure)
    if rmq310_running; then
        if [ -n "$changed" ]; then
            log "rmq310 runs with an outdated config: restarting it"
            rmq310_stop
        else
            log "rmq310 already running"
        fi
    fi
    if ! rmq310_running; then
        log "starting rmq310 (rabbitmq-server -detached)"
        rabbitmq-server -detached
    fi
    wait_for 120 "rmq310 node" rabbitmqctl -q await_startup --timeout 5 || return 1
    wait_for 60 "rmq310 listeners (5672, 5671, 15672, 5552)" rmq310_ready || return 1
    log "rmq310 ready: RabbitMQ $(mgmt_version 15672)"
}

rmq310_stop() {
    rmq310_running || return 0
    rabbitmqctl -q stop || true
    wait_for 60 "rmq310 to stop" bash -c '! rabbitmqctl -q status' || true
}

# ---------------------------------------------------------------- chroot brokers (rmq40, rmq43)
# cb NAME: sets CB_NAME CB_SUITE CB_ROOT CB_NODE CB_AMQP CB_MGMT CB_STREAM CB_DIST for one
# chroot broker. Commands inside a chroot run as root with a clean environment; the Debian
# wrappers in /usr/sbin switch to the chroot's rabbitmq user themselves.
cb() {
    local line fields
    for line in "${CHROOT_BROKERS[@]}"; do
        read -r -a fields <<<"$line"
        if [ "${fields[0]}" = "$1" ]; then
            CB_NAME=${fields[0]} CB_SUITE=${fields[1]} CB_ROOT=${fields[2]} CB_NODE=${fields[3]}
            CB_AMQP=${fields[4]} CB_MGMT=${fields[5]} CB_STREAM=${fields[6]} CB_DIST=${fields[7]}
            return 0
        fi
    done
    die "unknown chroot broker '$1'"
}

in_chroot() { # in_chroot ROOT CMD...
    local r=$1
    shift
    chroot "$r" /usr/bin/env -i \
        PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/var/lib/rabbitmq LANG=C.UTF-8 LC_ALL=C.UTF-8 \
        "$@"
}

chroot_mounts() { # chroot_mounts ROOT
    local r=$1
    if ! mountpoint -q "$r/proc"; then
        mount -t proc proc "$r/proc" || log "WARNING: cannot mount /proc in $r (unprivileged container?); trying without"
    fi
    # /dev from debootstrap may be a bare directory; Erlang needs /dev/null, /dev/urandom.
    if [ ! -c "$r/dev/null" ] || [ ! -c "$r/dev/urandom" ]; then
        mountpoint -q "$r/dev" || mount --bind /dev "$r/dev" || log "WARNING: cannot bind-mount /dev into $r"
    fi
    # Nodes are NAME@localhost: localhost (and this host's name) must resolve inside the chroot.
    cp /etc/hosts "$r/etc/hosts"
}

chroot_works() { # chroot_works ROOT
    [ -x "$1/usr/sbin/rabbitmq-server" ] && [ -f "$1/.rbak-ci-complete" ]
}

mirror_url() {
    if [ -n "$DEBIAN_MIRROR" ]; then echo "$DEBIAN_MIRROR"; return; fi
    # Reuse the Debian mirror this machine's apt uses (only package mirrors are reachable).
    # Only live entries: "URIs:" in deb822 .sources files, "deb URL" in .list files.
    local url
    url=$({
        grep -hE '^[[:space:]]*URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | sed 's/^[^:]*://'
        grep -hE '^[[:space:]]*deb[[:space:]]' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
            sed -E 's/\[[^]]*\]//'
    } | tr -s '[:blank:]' '\n' | grep -E '^https?://.*/debian/?$' | head -n1 || true)
    echo "${url:-http://deb.debian.org/debian}"
}

chroot_create() { # chroot_create NAME: debootstrap the broker's suite with rabbitmq-server into its chroot
    cb "$1"
    local root=$CB_ROOT suite=$CB_SUITE
    if chroot_works "$root"; then
        log "chroot $root already exists"
        return 0
    fi
    local tmp=$root.tmp mirror m
    mirror=$(mirror_url)
    for m in proc dev; do mountpoint -q "$tmp/$m" 2>/dev/null && umount "$tmp/$m"; done
    rm -rf "$tmp"
    log "debootstrap $suite from $mirror into $tmp (a minute or more)"
    debootstrap --variant=minbase --include=rabbitmq-server "$suite" "$tmp" "$mirror" \
        >"$RBAK_CI_DIR/debootstrap-$suite.log" 2>&1 ||
        { tail -n 30 "$RBAK_CI_DIR/debootstrap-$suite.log" >&2; return 1; }
    touch "$tmp/.rbak-ci-complete"
    if [ -e "$root" ]; then
        for m in proc dev; do mountpoint -q "$root/$m" && umount "$root/$m"; done
        rm -rf "$root"
    fi
    mv "$tmp" "$root"
}

cb_config_files() { # prints the files cb_configure writes
    cat "$CB_ROOT"/etc/rabbitmq/{rabbitmq-env.conf,rabbitmq.conf,enabled_plugins} \
        "$CB_ROOT"/etc/security/limits.d/rbak-rabbitmq.conf 2>/dev/null
}

cb_configure() { # prints "changed" when the config differs from before
    local r=$CB_ROOT before
    before=$(cb_config_files)
    cat >"$r/etc/rabbitmq/rabbitmq-env.conf" <<EOF
# Written by rbak .ci/setup.
NODENAME=$CB_NODE
DIST_PORT=$CB_DIST
EOF
    cat >"$r/etc/rabbitmq/rabbitmq.conf" <<EOF
# Written by rbak .ci/setup.
listeners.tcp.default = $CB_AMQP
management.tcp.port = $CB_MGMT
stream.listeners.tcp.1 = $CB_STREAM
stream.advertised_host = localhost
stream.advertised_port = $CB_STREAM
collect_statistics_interval = 1000
EOF
    printf '[rabbitmq_management,rabbitmq_stream].\n' >"$r/etc/rabbitmq/enabled_plugins"
    nofile_configure "$r" >/dev/null
    [ "$before" = "$(cb_config_files)" ] || echo changed
}

cb_ctl() { in_chroot "$CB_ROOT" rabbitmqctl -n "$CB_NODE" "$@"; }
cb_running() { cb_ctl -q status >/dev/null 2>&1; }
cb_ready() { mgmt_ok "$CB_MGMT" && port_open "$CB_AMQP" && port_open "$CB_STREAM"; }

chroot_broker_ctl() { # chroot_broker_ctl NAME ARGS...: rabbitmqctl for that node
    cb "$1"
    shift
    chroot_works "$CB_ROOT" || die "no chroot at $CB_ROOT (run .ci/setup)"
    chroot_mounts "$CB_ROOT"
    cb_ctl "$@"
}

chroot_broker_start() { # chroot_broker_start NAME
    cb "$1"
    chroot_works "$CB_ROOT" || die "no chroot at $CB_ROOT (run .ci/setup)"
    chroot_mounts "$CB_ROOT"
    local changed
    changed=$(cb_configure)
    if cb_running && [ -n "$changed" ]; then
        log "$CB_NAME runs with an outdated config: restarting it"
        chroot_broker_stop "$CB_NAME"
        cb "$1"
    fi
    if cb_running; then
        log "$CB_NAME already running"
    else
        log "starting $CB_NAME in $CB_ROOT"
        in_chroot "$CB_ROOT" rabbitmq-server -detached
    fi
    wait_for 180 "$CB_NAME node" cb_ctl -q await_startup --timeout 5 || return 1
    wait_for 60 "$CB_NAME listeners ($CB_AMQP, $CB_MGMT, $CB_STREAM)" cb_ready || return 1
    log "$CB_NAME ready: RabbitMQ $(mgmt_version "$CB_MGMT")"
}

chroot_broker_stop() { # chroot_broker_stop NAME
    cb "$1"
    chroot_works "$CB_ROOT" || return 0
    cb_running || return 0
    cb_ctl -q stop || true
    wait_for 60 "$CB_NAME to stop" bash -c "! chroot '$CB_ROOT' rabbitmqctl -n $CB_NODE -q status" || true
}

rmq40_start() { chroot_broker_start rmq40; }
rmq40_stop() { chroot_broker_stop rmq40; }
rmq43_start() { chroot_broker_start rmq43; }
rmq43_stop() { chroot_broker_stop rmq43; }

broker_mgmt_port() { # broker_mgmt_port NAME
    if [ "$1" = rmq310 ]; then echo 15672; else cb "$1"; echo "$CB_MGMT"; fi
}

# ---------------------------------------------------------------- Kubernetes API server (envtest-style)
# Debian sid packages etcd 3.5, kubectl and the upstream apiserver Go sources, but not
# kube-apiserver: .ci/kube-apiserver/main.go is a small server around those packages
# (see its header). It is built in its own sid chroot (never the broker chroots) in
# GOPATH mode, and the three binaries are cached in $RBAK_CI_KUBE_DIR/<key>/, key = a
# hash of the Go source and the packages' versions; $RBAK_CI_KUBE_DIR/current points at
# the newest build. tests/support/kubeapi.py runs them from there.
RBAK_CI_KUBE_CHROOT=${RBAK_CI_KUBE_CHROOT:-$RBAK_CI_DIR/kube-sid}
RBAK_CI_KUBE_DIR=${RBAK_CI_KUBE_DIR:-$RBAK_CI_DIR/kube}
KUBE_PACKAGES=(golang-go golang-k8s-apiextensions-apiserver-dev etcd-server kubectl)

kube_chroot_create() {
    local root=$RBAK_CI_KUBE_CHROOT tmp m mirror t0
    if [ -f "$root/.rbak-ci-complete" ]; then
        log "chroot $root already exists"
        return 0
    fi
    tmp=$root.tmp
    for m in proc dev; do mountpoint -q "$tmp/$m" 2>/dev/null && umount "$tmp/$m"; done
    rm -rf "$tmp"
    mirror=$(mirror_url)
    t0=$(date +%s)
    log "debootstrap sid from $mirror into $tmp"
    debootstrap --variant=minbase sid "$tmp" "$mirror" >"$RBAK_CI_DIR/debootstrap-kube-sid.log" 2>&1 ||
        { tail -n 30 "$RBAK_CI_DIR/debootstrap-kube-sid.log" >&2; return 1; }
    log "debootstrap: $(($(date +%s) - t0))s"
    # sid's Release file may be past its Valid-Until on the mirror.
    echo 'Acquire::Check-Valid-Until "false";' >"$tmp/etc/apt/apt.conf.d/99rbak-no-valid-until"
    chroot_mounts "$tmp"
    t0=$(date +%s)
    if ! { in_chroot "$tmp" apt-get update -q && in_chroot "$tmp" apt-get install -y -q \
        --no-install-recommends "${KUBE_PACKAGES[@]}" </dev/null; } >"$RBAK_CI_DIR/apt-kube-sid.log" 2>&1; then
        tail -n 30 "$RBAK_CI_DIR/apt-kube-sid.log" >&2
        return 1
    fi
    log "apt-get install ${KUBE_PACKAGES[*]}: $(($(date +%s) - t0))s"
    for m in proc dev; do mountpoint -q "$tmp/$m" && umount "$tmp/$m"; done
    touch "$tmp/.rbak-ci-complete"
    rm -rf "$root"
    mv "$tmp" "$root"
}

kube_key() { # prints the cache key: the Go source and the versions of every package it builds from
    {
        sha256sum <"$REPO/.ci/kube-apiserver/main.go"
        # shellcheck disable=SC2016 # dpkg-query's own ${...} format
        in_chroot "$RBAK_CI_KUBE_CHROOT" dpkg-query -W -f '${Package} ${Version}\n' |
            grep -E '^(golang-|etcd-server |kubectl )'
    } | sha256sum | cut -c1-16
}

kube_cached() { # kube_cached DIR: DIR holds three binaries that run on this machine
    [ -x "$1/rbak-kube-apiserver" ] && [ -x "$1/etcd" ] && [ -x "$1/kubectl" ] &&
        "$1/etcd" --version >/dev/null 2>&1 && "$1/kubectl" version --client >/dev/null 2>&1
}

kube_build() {
    local root=$RBAK_CI_KUBE_CHROOT key dir tmp t0
    kube_chroot_create
    chroot_mounts "$root"
    key=$(kube_key)
    dir=$RBAK_CI_KUBE_DIR/$key
    if kube_cached "$dir"; then
        log "kube binaries for key $key are cached in $dir"
    else
        t0=$(date +%s)
        log "building rbak-kube-apiserver (key $key; a cold build is several minutes)"
        rm -rf "$root/build" && install -d "$root/build"
        cp "$REPO/.ci/kube-apiserver/main.go" "$root/build/"
        # GOCACHE stays in the chroot: a changed main.go rebuilds in seconds.
        in_chroot "$root" sh -c 'cd /build && GOPATH=/usr/share/gocode GO111MODULE=off CGO_ENABLED=0 \
            GOCACHE=/var/cache/go-build go build -o rbak-kube-apiserver main.go' \
            >"$RBAK_CI_DIR/kube-build.log" 2>&1 || { tail -n 40 "$RBAK_CI_DIR/kube-build.log" >&2; return 1; }
        log "go build: $(($(date +%s) - t0))s"
        tmp=$(mktemp -d "$RBAK_CI_KUBE_DIR.XXXXXX")
        cp "$root/build/rbak-kube-apiserver" "$root/usr/bin/etcd" "$root/usr/bin/kubectl" "$tmp/"
        { sha256sum <"$REPO/.ci/kube-apiserver/main.go" | cut -d' ' -f1; } >"$tmp/SOURCE_SHA256"
        # shellcheck disable=SC2016 # dpkg-query's own ${...} format
        in_chroot "$root" dpkg-query -W -f '${Package} ${Version}\n' "${KUBE_PACKAGES[@]}" >"$tmp/VERSIONS"
        chmod 0755 "$tmp"
        kube_cached "$tmp" || { rm -rf "$tmp"; log "the built binaries do not run on this machine"; return 1; }
        install -d "$RBAK_CI_KUBE_DIR"
        rm -rf "$dir"
        mv "$tmp" "$dir"
    fi
    ln -sfn "$key" "$RBAK_CI_KUBE_DIR/current"
    # older builds (about 220 MB each) are never used again
    find "$RBAK_CI_KUBE_DIR" -mindepth 1 -maxdepth 1 -type d ! -name "$key" -exec rm -rf {} +
    log "kube binaries: $RBAK_CI_KUBE_DIR/current -> $key ($(tr '\n' ' ' <"$dir/VERSIONS"))"
}
