#!/usr/bin/env bash
# Proves that validate.mjs is a real validator: fixtures/valid.json must pass, and every
# fixtures/invalid-*.json must be rejected (exit status 1) for its intended reason (the
# diagnostic code or text listed below must appear in the output).
#
#   tools/asyncapi-validate/selftest.sh
#
# Ends with "N passed, N failed"; exits non-zero if anything failed.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$HERE"

command -v node >/dev/null || { echo "selftest: node is missing (run scripts/install-deps)" >&2; exit 1; }
[ -d node_modules/@asyncapi/parser ] \
    || { echo "selftest: $HERE/node_modules is missing (run scripts/install-deps)" >&2; exit 1; }

# What each broken fixture must be rejected for.
declare -A EXPECT=(
    [invalid-example-payload.json]='error sagaworks-message-example at /components/messages/OrderCreated.v1/examples/0/payload/amount_cents'
    [invalid-headers-not-object.json]='error sagaworks-headers-object at /components/messages/OrderCreated.v1/headers'
    [invalid-not-json.json]='not valid JSON'
    [invalid-operation-message-missing.json]="error invalid-ref at /operations/publishOrderEvents/messages/0/\$ref"
    [invalid-operation-message-not-in-channel.json]='error asyncapi3-operation-messages-from-referred-channel at /operations/publishOrderEvents/messages/0'
    [invalid-parameter-schema.json]='error asyncapi-document-resolved at /channels/orderEvents/parameters/prefix/schema'
    [invalid-parameter-undeclared.json]='error sagaworks-channel-parameters at /channels/orderEvents/address'
    [invalid-payload-type-typo.json]='error asyncapi-document-resolved at /components/messages/OrderCreated.v1/payload/schema/properties/order_id/type'
    [invalid-schema-format-typo.json]='error sagaworks-schema-format at /components/messages/OrderCreated.v1/payload/schemaFormat'
    [invalid-schema-local-definitions-ref.json]="error invalid-ref at /components/messages/OrderCreated.v1/payload/schema/properties/amount_cents/\$ref"
    [invalid-unknown-top-level-field.json]='error asyncapi-document-resolved at /events'
)

passed=0
failed=0
pass() { passed=$((passed + 1)); printf 'ok   %s\n' "$1"; }
fail() { failed=$((failed + 1)); printf 'FAIL %s: %s\n' "$1" "$2"; [ -z "${3:-}" ] || printf '%s\n' "$3" | sed 's/^/     | /'; }

# The valid sample: exit 0, no error diagnostic, and the summary with the right counts.
name=fixtures/valid.json
set +e
out=$(node validate.mjs "$name" 2>&1)
rc=$?
set -e
if [ "$rc" -ne 0 ]; then
    fail "$name" "expected exit 0, got $rc" "$out"
elif grep -q ' error ' <<<"$out"; then
    fail "$name" "exit 0 but an error diagnostic was printed" "$out"
elif ! grep -qF "$name: valid AsyncAPI 3.0.0 (1 channels, 1 messages, 2 operations)" <<<"$out"; then
    fail "$name" "no (or a wrong) success summary" "$out"
else
    pass "$name"
fi

shopt -s nullglob
invalid=(fixtures/invalid-*.json)
[ ${#invalid[@]} -ge 3 ] || fail fixtures/invalid-*.json "expected at least 3 broken fixtures, found ${#invalid[@]}"
for name in "${invalid[@]}"; do
    base=${name#fixtures/}
    set +e
    out=$(node validate.mjs "$name" 2>&1)
    rc=$?
    set -e
    expect=${EXPECT[$base]:-}
    if [ -z "$expect" ]; then
        fail "$name" "no expected diagnostic listed for it in selftest.sh"
    elif [ "$rc" -ne 1 ]; then
        fail "$name" "expected exit 1 (rejected), got $rc" "$out"
    elif ! grep -qF -- "$expect" <<<"$out"; then
        fail "$name" "rejected, but not with: $expect" "$out"
    else
        pass "$name"
    fi
done

# The command line itself: several files at once fail if any one fails.
set +e
node validate.mjs fixtures/valid.json fixtures/invalid-unknown-top-level-field.json >/dev/null 2>&1
rc=$?
set -e
if [ "$rc" -eq 1 ]; then pass "valid + invalid in one run exits 1"; else fail "valid + invalid in one run" "expected exit 1, got $rc"; fi

echo "selftest: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
