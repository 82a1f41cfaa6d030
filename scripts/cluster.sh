#!/usr/bin/env bash
# A local standalone Flink cluster from the apache-flink wheel, set up for pyflink-ndb.
#
#   scripts/cluster.sh up       set up var/cluster/ and start the cluster; waits until a
#                               TaskManager offers free slots (the REST API says so)
#   scripts/cluster.sh down     stop it
#   scripts/cluster.sh status   print the REST overview (exit 1 when not running)
#   scripts/cluster.sh env      print the exports that point `flink run` at this cluster
#   scripts/cluster.sh flink ARGS...
#                               the wheel's `flink` CLI with those exports, e.g.
#                               `scripts/cluster.sh flink run -py jobs/flight_delays.py --url …`
#
# What `up` sets up (everything under var/cluster/, git-ignored):
#   lib/   links to the wheel's lib/*.jar, opt/flink-python-*.jar (the wheel's cluster does
#          not put it on the TaskManager classpath: ClassNotFoundException KeyByKeySelector)
#          and the bridge jar; FLINK_LIB_DIR points here.
#   conf/  flink-conf.yaml = flink-conf/flink-conf.yaml + python.executable and
#          python.pythonpath set to the virtualenv (else `No module named 'pemja'`), the
#          wheel's JVM options, everything bound to localhost; FLINK_CONF_DIR points here.
#   log/   the JobManager and TaskManager logs (FLINK_LOG_DIR); pid/ their pid files.
#
#   scripts/cluster.sh taskmanager start|stop|stop-all
#                               the wheel's taskmanager.sh with those exports: one more
#                               TaskManager (e.g. to replace one that was killed)
#   scripts/cluster.sh jobmanager start|stop|stop-all
#                               the wheel's jobmanager.sh with those exports (`start` as
#                               start-cluster.sh starts a master: host localhost, the REST
#                               port); with FLINK_HA=zookeeper a JobManager started after
#                               one was killed takes the leadership and recovers its jobs
#
# High availability (FLINK_HA=zookeeper): `up` first starts a ZooKeeper server of its own
# with Flink's bin/zookeeper.sh (FlinkZooKeeperQuorumPeer: the ZooKeeper 3.7 server and
# client that the wheel's lib/flink-dist-*.jar bundles shaded, so nothing is installed;
# the wheel has no opt/flink-shaded-zookeeper-*.jar and needs none), listening on
# 127.0.0.1:FLINK_ZK_PORT (default: a free port), data in zk/; and sets Flink's ZooKeeper
# HA services: job graphs and completed-checkpoint metadata in ha/ (pointers in
# ZooKeeper), checkpoints in checkpoints/. `up` empties zk/, ha/ and checkpoints/ (a new
# cluster recovers nothing of an earlier one); `down` stops ZooKeeper too. Flink 1.20's
# docs, "ZooKeeper HA Services"
# (https://nightlies.apache.org/flink/flink-docs-release-1.20/docs/deployment/ha/zookeeper_ha/):
# high-availability.type: zookeeper, high-availability.storageDir (JobManager metadata;
# only a pointer to it is kept in ZooKeeper), high-availability.zookeeper.quorum, a
# cluster-id per cluster; "Bootstrap ZooKeeper": Flink's helper scripts start a simple
# ZooKeeper from conf/zoo.cfg (production setups should manage their own). And
# "Standalone", "Setting up High-Availability"
# (https://nightlies.apache.org/flink/flink-docs-release-1.20/docs/deployment/resource-providers/standalone/overview/#setting-up-high-availability):
# the ZooKeeper HA services, conf/masters (start-cluster.sh starts a JobManager per line;
# here one, and `jobmanager start` another after a kill, which the leader election makes
# the leader); under HA the JobManager picks a random RPC port (FLINK_RPC_PORT is unused:
# ZooKeeper tells the TaskManagers and the client where the leader is).
#
# Environment: VENV (default .venv; a virtualenv the wheel was installed into works too), CLUSTER_DIR (var/cluster), FLINK_REST_PORT (8081),
# FLINK_RPC_PORT (6123), FLINK_TASK_SLOTS (as in flink-conf/flink-conf.yaml),
# FLINK_TASKMANAGERS (1: the TaskManagers `up` starts and waits for), FLINK_EXTRA_CONF
# (lines `key: value` that replace or add to flink-conf/flink-conf.yaml's, e.g. a low
# heartbeat.timeout for fault tests), FLINK_HA (none; zookeeper: see above), FLINK_ZK_PORT,
# CLUSTER_TIMEOUT_S (90). A second cluster next to the
# first needs its own CLUSTER_DIR and ports (the tests use var/cluster-test, 18081 and
# 16123; tests/faults uses var/cluster-faults, 28081 and 26123).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
VENV="${VENV:-$ROOT/.venv}"
case "$VENV" in /*) ;; *) VENV="$ROOT/$VENV" ;; esac
PY="$VENV/bin/python"
CLUSTER_DIR="${CLUSTER_DIR:-$ROOT/var/cluster}"
REST_PORT="${FLINK_REST_PORT:-8081}"
RPC_PORT="${FLINK_RPC_PORT:-6123}"
TASK_SLOTS="${FLINK_TASK_SLOTS:-}"
TIMEOUT_S="${CLUSTER_TIMEOUT_S:-90}"
TASKMANAGERS="${FLINK_TASKMANAGERS:-1}"
EXTRA_CONF="${FLINK_EXTRA_CONF:-}"
HA="${FLINK_HA:-none}"
ZK_PORT="${FLINK_ZK_PORT:-}"

die() { echo "cluster.sh: error: $*" >&2; exit 1; }

case "$TASKMANAGERS" in ''|*[!0-9]*|0) die "FLINK_TASKMANAGERS must be a number >= 1, not '$TASKMANAGERS'" ;; esac
case "$HA" in none|zookeeper) ;; *) die "FLINK_HA must be none or zookeeper, not '$HA'" ;; esac

[ -x "$PY" ] || die "no virtualenv at $VENV (run \`make venv\`)"
# The bridge jar of the pyflink_ndb that VENV imports (the checkout's for the editable
# install of `make venv`, the wheel's for a virtualenv the wheel was installed into).
BRIDGE_JAR="$("$PY" -I -c 'import importlib.util, os
spec = importlib.util.find_spec("pyflink_ndb")
print(os.path.join(list(spec.submodule_search_locations)[0], "jars", "pyflink-ndb-bridge.jar"))' \
    2>/dev/null)" || BRIDGE_JAR="$ROOT/pyflink_ndb/jars/pyflink-ndb-bridge.jar"
# Thread mode and the flink scripts (find_flink_home.py) want the virtualenv first on PATH.
export PATH="$VENV/bin:$PATH"
FLINK_HOME="$("$PY" -c 'import os, pyflink; print(os.path.dirname(os.path.abspath(pyflink.__file__)))')" \
    || die "apache-flink is not installed in $VENV"
export FLINK_HOME
export FLINK_LIB_DIR="$CLUSTER_DIR/lib"
export FLINK_CONF_DIR="$CLUSTER_DIR/conf"
export FLINK_LOG_DIR="$CLUSTER_DIR/log"
export FLINK_PID_DIR="$CLUSTER_DIR/pid"
REST_URL="http://localhost:$REST_PORT"
ZK_DATA="$CLUSTER_DIR/zk"
HA_DIR="$CLUSTER_DIR/ha"
CHECKPOINT_DIR="$CLUSTER_DIR/checkpoints"

# The HA mode of the cluster set up last (its flink-conf.yaml): `down` needs no FLINK_HA.
configured_ha() {
    sed -n 's/^high-availability\.type: *//p' "$FLINK_CONF_DIR/flink-conf.yaml" 2>/dev/null | tail -n 1
}
free_port() {
    "$PY" -c 'import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])'
}

# Flink's keys of ZooKeeper HA (FLINK_EXTRA_CONF may replace any of them).
ha_conf() {
    echo "high-availability.type: zookeeper"
    echo "high-availability.zookeeper.quorum: localhost:$ZK_PORT"
    echo "high-availability.zookeeper.path.root: /flink"
    echo "high-availability.cluster-id: /$(basename "$CLUSTER_DIR")"
    echo "high-availability.storageDir: file://$HA_DIR"
    # The checkpoints that ha/ points at must outlive the JobManager too.
    echo "state.checkpoints.dir: file://$CHECKPOINT_DIR"
    # A new JobManager becomes the leader only once the killed one's ZooKeeper session has
    # expired (its leader latch is an ephemeral node): Flink's default session timeout of
    # 60 s (the server caps it at 20 ticks) would add that much to every recovery. With
    # 10 s, a JobManager that does not hear from ZooKeeper for 2/3 of it (a loaded
    # 2-core machine did that for 4 s) sees its connection SUSPENDED, which by default
    # revokes its leadership (the jobs are suspended and recreated); tolerating suspended
    # connections (Flink's docs, "Tolerating Suspended ZooKeeper Connections") leaves the
    # leadership until the session is lost.
    echo "high-availability.zookeeper.client.session-timeout: 10000"
    echo "high-availability.zookeeper.client.connection-timeout: 10000"
    echo "high-availability.zookeeper.client.tolerate-suspended-connections: true"
    echo "zookeeper.heap.mb: 256"
}

# conf/zoo.cfg, which bin/zookeeper.sh reads (no server.N lines: one standalone server).
zoo_cfg() {
    echo "# Generated by scripts/cluster.sh (FLINK_HA=zookeeper); do not edit."
    echo "tickTime=1000"
    echo "initLimit=10"
    echo "syncLimit=5"
    echo "dataDir=$ZK_DATA"
    echo "clientPort=$ZK_PORT"
    echo "clientPortAddress=127.0.0.1"
    echo "maxClientCnxns=0"
    # ZooKeeper's AdminServer would take port 8080; srvr answers the readiness probe.
    echo "admin.enableServer=false"
    echo "4lw.commands.whitelist=srvr"
}

setup() {
    [ -f "$BRIDGE_JAR" ] || die "the bridge jar is missing at $BRIDGE_JAR (run \`make jar\`)"
    if [ "$HA" = zookeeper ] && [ -z "$ZK_PORT" ]; then ZK_PORT="$(free_port)"; fi
    rm -rf "$FLINK_LIB_DIR" "$FLINK_CONF_DIR"
    mkdir -p "$FLINK_LIB_DIR" "$FLINK_CONF_DIR" "$FLINK_LOG_DIR" "$FLINK_PID_DIR"
    local jar
    for jar in "$FLINK_HOME"/lib/*.jar "$FLINK_HOME"/opt/flink-python-*.jar "$BRIDGE_JAR"; do
        [ -f "$jar" ] || die "missing $jar"
        ln -s "$jar" "$FLINK_LIB_DIR/$(basename "$jar")"
    done
    cp "$FLINK_HOME"/conf/log4j*.properties "$FLINK_HOME"/conf/logback*.xml "$FLINK_CONF_DIR/"
    local i
    : >"$FLINK_CONF_DIR/workers"
    for ((i = 0; i < TASKMANAGERS; i++)); do echo "localhost" >>"$FLINK_CONF_DIR/workers"; done
    echo "localhost:$REST_PORT" >"$FLINK_CONF_DIR/masters"

    local site java_opts extra_keys
    # The keys FLINK_EXTRA_CONF sets, as a pattern that removes them from the base file.
    extra_keys="$(printf '%s\n' "$EXTRA_CONF" | sed -n 's/^ *\([A-Za-z0-9_.-]*\): .*/\1/p' |
        sed 's/\./\\./g' | paste -sd '|' -)"
    site="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    # The wheel's config.yaml carries the --add-opens/--add-exports Java 17 needs.
    java_opts="$(sed -n 's/^ *all: *//p' "$FLINK_HOME/conf/config.yaml" | head -n 1)"
    {
        echo "# Generated by scripts/cluster.sh from flink-conf/flink-conf.yaml; do not edit."
        grep -v -E '^ *(python\.executable|python\.pythonpath|rest\.port|jobmanager\.rpc\.port|env\.java\.opts\.all):' \
            "$ROOT/flink-conf/flink-conf.yaml" |
            if [ -n "$TASK_SLOTS" ]; then grep -v -E '^ *taskmanager\.numberOfTaskSlots:'; else cat; fi |
            if [ -n "$extra_keys" ]; then grep -v -E "^ *($extra_keys):"; else cat; fi
        echo ""
        echo "# Added by scripts/cluster.sh"
        echo "python.executable: $PY"
        # site-packages for pemja and the dependencies; the repository root for the
        # editable pyflink_ndb (an import hook in a .pth file, which PEMJA does not run)
        # and the example jobs' modules.
        echo "python.pythonpath: $site:$ROOT"
        echo "rest.port: $REST_PORT"
        echo "jobmanager.rpc.port: $RPC_PORT"
        [ -z "$TASK_SLOTS" ] || echo "taskmanager.numberOfTaskSlots: $TASK_SLOTS"
        echo "jobmanager.bind-host: localhost"
        echo "taskmanager.bind-host: localhost"
        echo "taskmanager.host: localhost"
        # flink-python and the bridge are in lib/ and also reach the TaskManager as user
        # jars (`flink run -py` ships flink-python, the job ships the bridge): child-first
        # loading then fails with "loader constraint violation ... pemja.core.PythonInterpreter".
        echo "classloader.resolve-order: parent-first"
        [ -z "$java_opts" ] || echo "env.java.opts.all: $java_opts"
        if [ "$HA" = zookeeper ]; then
            echo "# ZooKeeper high availability (FLINK_HA=zookeeper; see scripts/cluster.sh)"
            ha_conf | if [ -n "$extra_keys" ]; then grep -v -E "^ *($extra_keys):"; else cat; fi
        fi
        if [ -n "$EXTRA_CONF" ]; then
            echo "# FLINK_EXTRA_CONF"
            printf '%s\n' "$EXTRA_CONF"
        fi
    } >"$FLINK_CONF_DIR/flink-conf.yaml"
    if [ "$HA" = zookeeper ]; then zoo_cfg >"$FLINK_CONF_DIR/zoo.cfg"; fi
}

zk_answers() {  # exit 0 when ZooKeeper on 127.0.0.1:$1 serves (its srvr command)
    "$PY" -c 'import socket, sys
with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=2) as s:
    s.sendall(b"srvr")
    data = b""
    while chunk := s.recv(4096):
        data += chunk
sys.exit(0 if b"Mode: standalone" in data else 1)' "$1" 2>/dev/null
}

zk_start() {
    rm -rf "$ZK_DATA" "$HA_DIR" "$CHECKPOINT_DIR"
    mkdir -p "$ZK_DATA" "$HA_DIR" "$CHECKPOINT_DIR"
    "$FLINK_HOME/bin/zookeeper.sh" start 1 >"$FLINK_LOG_DIR/zookeeper-start.out" 2>&1 \
        || { log_tail; die "zookeeper.sh start failed; logs in $FLINK_LOG_DIR"; }
    local deadline=$((SECONDS + 60))
    while [ $SECONDS -lt $deadline ]; do
        if zk_answers "$ZK_PORT"; then return 0; fi
        sleep 0.5
    done
    log_tail
    zk_stop >/dev/null 2>&1
    die "ZooKeeper did not answer on 127.0.0.1:$ZK_PORT within 60 s; logs in $FLINK_LOG_DIR"
}

# Stop the live processes of a flink-daemon.sh pid file as `flink-daemon.sh stop-all` does
# (SIGTERM, SIGKILL after 10 s), without its config.sh (a JVM that parses the config); only
# processes whose command line names this cluster's conf dir (a pid may have been reused).
stop_daemons() {
    local file pid n
    for file in "$FLINK_PID_DIR"/flink-*-"$1".pid; do
        [ -f "$file" ] || continue
        while read -r pid; do
            case "$pid" in ''|*[!0-9]*) continue ;; esac
            tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -qF -- "$FLINK_CONF_DIR" || continue
            echo "Stopping $1 (pid: $pid)."
            kill "$pid" 2>/dev/null || true
            for ((n = 0; n < 100; n++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
            kill -9 "$pid" 2>/dev/null || true
        done <"$file"
        rm -f "$file"
    done
}

zk_stop() { stop_daemons zookeeper; }

overview() { curl -fsS --max-time 3 "$REST_URL/overview" 2>/dev/null; }

free_slots() {  # prints the free slots of the overview on stdin ("" when unreadable), 0
    # until FLINK_TASKMANAGERS TaskManagers registered
    "$PY" -c 'import json, sys
o = json.load(sys.stdin)
print(o["slots-available"] if o.get("taskmanagers", 0) >= int(sys.argv[1]) else 0)' \
        "$TASKMANAGERS" 2>/dev/null || true
}

log_tail() {
    local f
    for f in "$FLINK_LOG_DIR"/*.log "$FLINK_LOG_DIR"/*.out; do
        [ -s "$f" ] || continue
        echo "---- tail of $f" >&2
        tail -n 25 "$f" >&2
    done
}

up() {
    if overview >/dev/null; then
        die "something already answers on $REST_URL (run \`$0 down\`, or set FLINK_REST_PORT)"
    fi
    setup
    rm -f "$FLINK_LOG_DIR"/*
    if [ "$HA" = zookeeper ]; then zk_stop >/dev/null; zk_start; fi
    "$FLINK_HOME/bin/start-cluster.sh" >"$FLINK_LOG_DIR/start-cluster.out" 2>&1 \
        || { log_tail; zk_stop >/dev/null 2>&1; die "start-cluster.sh failed; logs in $FLINK_LOG_DIR"; }
    local deadline=$((SECONDS + TIMEOUT_S)) slots=""
    while [ $SECONDS -lt $deadline ]; do
        slots="$(overview | free_slots)" || slots=""
        if [ -n "$slots" ] && [ "$slots" -gt 0 ]; then
            echo "cluster up: $REST_URL, $TASKMANAGERS TaskManager(s), $slots free slots (conf $FLINK_CONF_DIR, logs $FLINK_LOG_DIR)$([ "$HA" != zookeeper ] || echo "; ZooKeeper HA, ZooKeeper on 127.0.0.1:$ZK_PORT")"
            return 0
        fi
        sleep 1
    done
    log_tail
    "$FLINK_HOME/bin/stop-cluster.sh" >/dev/null 2>&1 || true  # no half-started cluster left
    if [ "$HA" = zookeeper ]; then zk_stop >/dev/null 2>&1; fi
    die "no TaskManager with free slots on $REST_URL after ${TIMEOUT_S}s; logs in $FLINK_LOG_DIR"
}

down() {
    local ha=""
    if [ -d "$FLINK_CONF_DIR" ]; then
        ha="$(configured_ha)"
        "$FLINK_HOME/bin/stop-cluster.sh" || true
        # stop-cluster.sh stops the last JobManager of the pid file; after a kill and a
        # restart (HA) an earlier one may still run.
        if [ "$ha" = zookeeper ]; then stop_daemons standalonesession; fi
    fi
    local deadline=$((SECONDS + 30))
    while overview >/dev/null && [ $SECONDS -lt $deadline ]; do sleep 1; done
    if [ "$ha" = zookeeper ]; then zk_stop; fi
    if overview >/dev/null; then die "the cluster on $REST_URL still answers after stop"; fi
    echo "cluster down"
}

status() {
    local o
    o="$(overview)" || { echo "no cluster on $REST_URL"; return 1; }
    echo "$o"
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    status) status ;;
    env)
        echo "export PATH=\"$VENV/bin:\$PATH\" FLINK_HOME=\"$FLINK_HOME\""
        echo "export FLINK_LIB_DIR=\"$FLINK_LIB_DIR\" FLINK_CONF_DIR=\"$FLINK_CONF_DIR\""
        echo "export FLINK_LOG_DIR=\"$FLINK_LOG_DIR\" FLINK_PID_DIR=\"$FLINK_PID_DIR\""
        ;;
    flink)
        shift
        [ -f "$FLINK_CONF_DIR/flink-conf.yaml" ] || die "no cluster set up (run \`$0 up\`)"
        exec "$FLINK_HOME/bin/flink" "$@"
        ;;
    taskmanager)
        shift
        [ -f "$FLINK_CONF_DIR/flink-conf.yaml" ] || die "no cluster set up (run \`$0 up\`)"
        exec "$FLINK_HOME/bin/taskmanager.sh" "$@"
        ;;
    jobmanager)
        shift
        [ -f "$FLINK_CONF_DIR/flink-conf.yaml" ] || die "no cluster set up (run \`$0 up\`)"
        if [ "${1:-}" = start ] && [ $# -eq 1 ]; then
            # As start-cluster.sh starts each master of conf/masters.
            exec "$FLINK_HOME/bin/jobmanager.sh" start localhost "$REST_PORT"
        fi
        exec "$FLINK_HOME/bin/jobmanager.sh" "$@"
        ;;
    *) echo "usage: $0 up|down|status|env|flink ARGS...|taskmanager ARGS...|jobmanager ARGS..." >&2; exit 2 ;;
esac
