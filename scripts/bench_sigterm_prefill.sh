#!/bin/bash
# SIGTERM during a long prefill: seconds from the signal to the process's exit.
# usage: scripts/bench_sigterm_prefill.sh BIN MODEL PROMPT_TOKENS GRACE_S
BIN=$1; MODEL=$2; N=$3; GRACE=$4
PORT=$((20000 + RANDOM % 10000))
$BIN serve --model $MODEL --port $PORT --context $((N + 64)) --shutdown-grace $GRACE 2> ${TMPDIR:-/tmp}/sig-serve.err &
PID=$!
for i in $(seq 1 600); do curl -s localhost:$PORT/health | grep -q '"ok"\|ready' && break; sleep 0.5; done
python3 -c "import json; print(json.dumps({'prompt': [(i*7919+13)%150000 for i in range($N)], 'max_tokens': 4, 'stream': True}))" > ${TMPDIR:-/tmp}/sig-body.json
curl -s -N localhost:$PORT/v1/completions -H 'content-type: application/json' -d @${TMPDIR:-/tmp}/sig-body.json > ${TMPDIR:-/tmp}/sig-resp.txt &
CURL=$!
sleep 8
T0=$(date +%s.%N)
kill -TERM $PID
wait $PID; RC=$?
T1=$(date +%s.%N)
wait $CURL
echo "exit rc=$RC after $(echo "$T1 - $T0" | bc) s (grace $GRACE s)"
tail -3 ${TMPDIR:-/tmp}/sig-serve.err
tail -c 300 ${TMPDIR:-/tmp}/sig-resp.txt; echo
