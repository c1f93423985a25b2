#!/usr/bin/env bash
# A CI pipeline step: validate, preview, activate against the generation
# that was previewed, smoke-test, and roll back if the smoke test fails.
#
#   CUTOVER_ADMIN=http://127.0.0.1:9190 examples/ci-activate.sh candidate.toml http://127.0.0.1:8080/healthz
#
# Exit codes: 0 activated (or unchanged), 1 rejected, 2 conflict (someone
# else activated since the preview: re-run the step), 3 anything else,
# 4 smoke test failed and the change was rolled back.
set -euo pipefail

candidate=${1:?usage: ci-activate.sh CANDIDATE.toml SMOKE_URL}
smoke_url=${2:?usage: ci-activate.sh CANDIDATE.toml SMOKE_URL}
ctl=${CUTOVER:-cutover}
reason="${CI_COMMIT_SHA:-manual} ${CI_PIPELINE_URL:-}"

# 1. Validate: every error with line and column, every restart-required change.
"$ctl" ctl validate "$candidate"

# 2. Preview, recorded in history; remember what it was planned against.
plan=$("$ctl" ctl --json preview "$candidate" --reason "$reason" --requested-by ci)
expected=$(printf '%s' "$plan" | python3 -c 'import json,sys; print(json.load(sys.stdin)["active_generation"])')
echo "planned against generation $expected"

# 3. Activate only if nothing changed since the preview (409 otherwise).
result=$("$ctl" ctl --json activate "$candidate" --expect "$expected" --reason "$reason" --requested-by ci)
read -r outcome generation < <(printf '%s' "$result" | python3 -c 'import json,sys; a=json.load(sys.stdin); print(a["outcome"], a["generation"])')
echo "$outcome: generation $generation"
[ "$outcome" = "unchanged" ] && exit 0

# 4. Smoke test; on failure, roll back to what was active before.
if ! curl -fsS --max-time 5 -o /dev/null "$smoke_url"; then
  echo "smoke test failed: rolling back to generation $expected" >&2
  "$ctl" ctl rollback --to "$expected" --expect "$generation" --reason "smoke test failed for $reason" --requested-by ci
  exit 4
fi
echo "smoke test passed"
