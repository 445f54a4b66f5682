#!/usr/bin/env bash
# Start a long GPU job once (setsid nohup, output under /tmp/res) and wait for it up to $WAIT seconds
# (default 570), then copy /tmp/res to $OUT as res.tgz. Call again within the device's idle window to
# keep waiting (give no JOB then: a machine lost in between is reported, not restarted with a bogus job); the
# job is started only if /tmp/res/started is absent. JOB: the command line to run, OUT=/tmp/res for its files.
set -uo pipefail
WAIT=${WAIT:-570}
mkdir -p /tmp/res
if [ ! -e /tmp/res/started ]; then
  if [ -z "${JOB:-}" ]; then  # a poll without JOB on a machine that never started one: it is a fresh machine
    echo "no job on this machine (a fresh one: the last was released); start again with JOB=..." >&2
    exit 3
  fi
  touch /tmp/res/started
  setsid nohup bash -c "$JOB" > /tmp/res/job.out 2>&1 < /dev/null &
fi
end=$((SECONDS + WAIT))
while [ $SECONDS -lt $end ]; do
  grep -q '] exit ' /tmp/res/run.log 2>/dev/null && break
  sleep 5
done
tail -4 /tmp/res/run.log 2>/dev/null
tar czf "$OUT/res.tgz" -C /tmp res 2>/dev/null
