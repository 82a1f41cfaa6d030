#!/usr/bin/env bash
# Build the pyflink-ndb Java bridge against the jars inside the installed apache-flink wheel.
#
#   java-bridge/build.sh [PYTHON] [OUT_JAR]
#
# PYTHON   interpreter that has apache-flink installed
#          (default: $PYTHON, else <repo>/.venv/bin/python, else python3)
# OUT_JAR  output jar (default: <repo>/pyflink_ndb/jars/pyflink-ndb-bridge.jar)
#
# No Maven, no downloads: javac --release 11 against pyflink/opt/flink-python-*.jar and
# pyflink/lib/*.jar.
set -euo pipefail

die() { echo "java-bridge/build.sh: $*" >&2; exit 1; }

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"

if [ $# -ge 1 ] && [ -n "$1" ]; then
    PY="$1"
elif [ -n "${PYTHON:-}" ]; then
    PY="$PYTHON"
elif [ -x "$REPO/.venv/bin/python" ]; then
    PY="$REPO/.venv/bin/python"
else
    PY="python3"
fi
OUT="${2:-$REPO/pyflink_ndb/jars/pyflink-ndb-bridge.jar}"

command -v "$PY" >/dev/null 2>&1 || die "Python interpreter '$PY' not found"
command -v javac >/dev/null 2>&1 || die "javac not found on PATH (install a JDK 11 or newer)"
command -v jar >/dev/null 2>&1 || die "jar not found on PATH (install a JDK 11 or newer)"

PYFLINK_DIR="$("$PY" -c 'import pyflink, os; print(os.path.dirname(pyflink.__file__))' 2>/dev/null)" \
    || die "'$PY' cannot import pyflink: install apache-flink 1.20.* into that interpreter"
[ -d "$PYFLINK_DIR" ] || die "pyflink directory '$PYFLINK_DIR' does not exist"

shopt -s nullglob
PY_JARS=("$PYFLINK_DIR"/opt/flink-python-*.jar)
LIB_JARS=("$PYFLINK_DIR"/lib/*.jar)
shopt -u nullglob
[ ${#PY_JARS[@]} -ge 1 ] || die "no flink-python-*.jar in $PYFLINK_DIR/opt"
[ ${#LIB_JARS[@]} -ge 1 ] || die "no jars in $PYFLINK_DIR/lib"
CP="${PY_JARS[0]}:$PYFLINK_DIR/lib/*"

SRC="$HERE/src/main/java"
mapfile -t SOURCES < <(find "$SRC" -name '*.java' | sort)
[ ${#SOURCES[@]} -ge 1 ] || die "no Java sources under $SRC"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/pyflink-ndb-bridge.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

echo "java-bridge: compiling ${#SOURCES[@]} sources against $(basename "${PY_JARS[0]}") + $PYFLINK_DIR/lib" >&2
javac --release 11 -Xlint:unchecked -encoding UTF-8 -cp "$CP" -d "$WORK/classes" "${SOURCES[@]}" \
    || die "javac failed"

mkdir -p "$(dirname "$OUT")"
OUT_ABS="$(cd "$(dirname "$OUT")" && pwd)/$(basename "$OUT")"
rm -f "$OUT_ABS"
jar cf "$OUT_ABS" -C "$WORK/classes" . || die "jar failed"
echo "$OUT_ABS"
