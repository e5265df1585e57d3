#!/usr/bin/env bash
# tests/sim_hosts.sh — simulated hosts on this one machine, for tests/test_hosts.sh (as root).
# Each host is a process that holds its own UTS namespace (its hostname is its name), network
# namespace (eth0 at 10.77.0.N/24, a veth whose other end is on the bridge ggbr0) and mount
# namespace (DIR/local is its own disk: DIR/disk/NAME bind-mounted there). mpirun runs in one
# more network namespace, the launcher's (10.77.0.254), so that the TCP settings below are
# its own. The bridge has no address: nothing reaches this machine's own network, or leaves it.
#   sim_hosts.sh up DIR NAME...      makes the hosts (DIR/hostfile lists them; DIR/NAME.pid, the
#                                    holders); exit 1, saying why, when it cannot
#   sim_hosts.sh down DIR            ends every process inside the hosts' and the launcher's
#                                    namespaces and the holders (the namespaces and veths go with
#                                    them), removes the bridge; safe to call twice, or after a
#                                    failed up
#   sim_hosts.sh run CMD...          CMD in the launcher's network namespace (mpirun)
#   sim_hosts.sh agent NAME CMD...   Open MPI's rsh agent (--mca plm_rsh_agent "sim_hosts.sh
#                                    agent"): CMD through sh -c, as ssh runs it, inside host NAME
#   sim_hosts.sh stop NAME           ends every process on host NAME (a lost host's orted, ranks)
#   sim_hosts.sh link NAME up|down   the bridge's end of that host's link
#   sim_hosts.sh slow NAME DELAY RATE   netem (delay and rate) on that host's link, both ways;
#                                    where the kernel has no netem, tbf at RATE alone; prints the
#                                    qdisc used
# GRIDGPT_HOSTS_DIR names DIR for every command but up and down.
# The launcher's TCP gives up on a peer that acknowledges nothing after about 3 s
# (net.ipv4.tcp_retries2 = 3, in its namespace only): once a rank has ended the job, mpirun
# tells every host's daemon to end its ranks, and with Linux's default (15: about 15 minutes)
# it would wait that long for a host whose link is down before it exits.
set -u
BRIDGE=ggbr0
NET=10.77.0
cmd=${1:?usage: sim_hosts.sh up DIR NAME... | down DIR | run CMD... | agent NAME CMD... | stop NAME | link NAME up|down | slow NAME DELAY RATE}
shift

pid_of() { cat "${GRIDGPT_HOSTS_DIR:?}/$1.pid"; }   # the process holding host NAME's namespaces
veth_of() { echo "ggv-$1" | cut -c1-15; }           # the bridge's end of NAME's link

# a namespace holder: unshare's FLAGS, then COMMANDS run inside before it sleeps until `down`
hold() {  # dir name flags commands
    local dir=$1 name=$2 flags=$3 commands=$4
    # (its output to a file: a holder must not keep open the output of whoever called `up`)
    unshare $flags sh -c "$commands && exec sleep 100000" < /dev/null > "$dir/$name.log" 2>&1 &
    echo $! > "$dir/$name.pid"
}

# a veth from the bridge to the holder's network namespace: eth0 at ADDRESS there
link_to_bridge() {  # name pid address
    local veth inner=gg-in-$$-$RANDOM
    veth=$(veth_of $1)
    ip link add $veth type veth peer name ${inner:0:15} || return 1
    ip link set ${inner:0:15} netns $2 && ip link set $veth master $BRIDGE && ip link set $veth up || return 1
    nsenter -t $2 -n sh -c "ip link set ${inner:0:15} name eth0 && ip addr add $3/24 dev eth0 && ip link set eth0 up &&
                            ip link set lo up"
}

# Every process inside the holder's network namespace but the holder (orted, ranks: a host
# whose link went down keeps them), with SIGKILL; never in this machine's own namespace (a
# holder that failed to make its own). 1: no such holder.
end_inside() {  # holder-pid
    local ns p
    ns=$(readlink /proc/$1/ns/net 2> /dev/null)
    [ -n "$ns" ] && [ "$ns" != "$(readlink /proc/$$/ns/net)" ] || return 1
    for p in /proc/[0-9]*; do
        p=${p#/proc/}
        [ "$p" != "$1" ] && [ "$(readlink /proc/$p/ns/net 2> /dev/null)" = "$ns" ] && kill -9 $p 2> /dev/null
    done
    return 0
}

case $cmd in
up)
    dir=$1; shift
    mkdir -p "$dir/local" "$dir/disk"
    : > "$dir/hostfile"
    ip link add $BRIDGE type bridge 2> /dev/null && ip link set $BRIDGE up ||
        { echo "cannot make the bridge $BRIDGE (ip link add $BRIDGE type bridge)"; exit 1; }
    hold "$dir" launcher "--net" "sysctl -q -w net.ipv4.tcp_retries2=3"
    i=0
    for name in "$@"; do
        i=$((i + 1))
        mkdir -p "$dir/disk/$name"
        hold "$dir" $name "--uts --net --mount --propagation private" \
            "hostname $name && mount --bind '$dir/disk/$name' '$dir/local'"
    done
    for name in launcher "$@"; do   # each holder ready: its hostname set, its disk mounted
        pid=$(cat "$dir/$name.pid")
        for t in $(seq 100); do
            [ $name = launcher ] && [ "$(nsenter -t $pid -n sysctl -n net.ipv4.tcp_retries2 2> /dev/null)" = 3 ] && break
            [ "$(nsenter -t $pid -u hostname 2> /dev/null)" = "$name" ] && grep -q " $dir/local " /proc/$pid/mounts 2> /dev/null && break
            kill -0 $pid 2> /dev/null || { echo "cannot make $name's namespaces (unshare --uts --net --mount)"; exit 1; }
            sleep 0.05
        done
    done
    link_to_bridge launcher "$(cat "$dir/launcher.pid")" $NET.254 || { echo "cannot link the launcher to the bridge"; exit 1; }
    i=0
    for name in "$@"; do
        i=$((i + 1))
        link_to_bridge $name "$(cat "$dir/$name.pid")" $NET.$i || { echo "cannot link host $name to the bridge"; exit 1; }
        echo "$name slots=8" >> "$dir/hostfile"
    done
    ;;
down)
    dir=$1
    for f in "$dir"/*.pid; do
        [ -e "$f" ] || continue
        end_inside "$(cat "$f")" && kill -9 "$(cat "$f")" 2> /dev/null
        rm -f "$f"
    done
    ip link del $BRIDGE 2> /dev/null
    for v in $(ls /sys/class/net | grep '^ggv-'); do ip link del $v 2> /dev/null; done
    true
    ;;
stop)
    end_inside "$(pid_of $1)"
    ;;
run)
    exec nsenter -t "$(pid_of launcher)" -n -- "$@"
    ;;
agent)
    name=$1; shift
    exec nsenter -t "$(pid_of $name)" -u -n -m -- sh -c "$*"
    ;;
link)
    ip link set "$(veth_of $1)" $2
    ;;
slow)
    name=$1 delay=$2 rate=$3
    qdisc="netem delay $delay rate $rate"
    if ! tc qdisc replace dev "$(veth_of $name)" root $qdisc 2> /dev/null; then
        qdisc="tbf rate $rate burst 16kb latency 100ms"
        tc qdisc replace dev "$(veth_of $name)" root $qdisc || exit 1
    fi
    nsenter -t "$(pid_of $name)" -n tc qdisc replace dev eth0 root $qdisc || exit 1
    echo "$qdisc"
    ;;
*)
    echo "sim_hosts.sh: unknown command $cmd" >&2
    exit 2
    ;;
esac
