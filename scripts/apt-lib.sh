# Installs Debian/Ubuntu packages for psmr's scripts (sourced by
# scripts/setup.sh and scripts/peers.sh): only those absent, and without
# starting or enabling any service they bring (psmr's tests and benchmarks
# start their own redis-server and etcd processes, on free loopback ports).

# apt_install PKG... : installs the packages among PKG... that dpkg does not
# know yet.
apt_install() {
    local sudo="" need=() pkg
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    for pkg in "$@"; do
        dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
    done
    [ ${#need[@]} -gt 0 ] || return 0
    # A policy-rc.d that answers 101 ("action not allowed") keeps the
    # packages' maintainer scripts from starting their services (the
    # Debian way, honoured by invoke-rc.d and deb-systemd-invoke). One
    # that is already there is the machine's own: leave it alone.
    local policy=/usr/sbin/policy-rc.d ours=""
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
        $sudo chmod 755 "$policy"
        ours=1
    fi
    $sudo apt-get update -qq
    local status=0
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" || status=$?
    [ -z "$ours" ] || $sudo rm -f "$policy"
    [ "$status" -eq 0 ] || return "$status"
    # The packages enable their units for the next boot: nothing here needs
    # them. Under a running systemd they are stopped too; without one,
    # systemctl edits the unit links offline.
    if command -v systemctl >/dev/null 2>&1; then
        local now=""
        [ ! -d /run/systemd/system ] || now="--now"
        for pkg in "${need[@]}"; do
            case "$pkg" in
                etcd-server) $sudo systemctl disable $now etcd >/dev/null 2>&1 || true ;;
                redis-server) $sudo systemctl disable $now redis-server >/dev/null 2>&1 || true ;;
            esac
        done
    fi
}
