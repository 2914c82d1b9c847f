# shellcheck shell=bash
# The RustSec advisory check, offline: source this, then call `sw_advisories_check`.
#
# These machines cannot reach GitHub, where cargo-deny clones the RustSec advisory database
# from. A snapshot of it comes with the machine (../shared/rustsec/advisory-db.tar.gz beside
# the checkout, or SW_RUSTSEC_SNAPSHOT): it is unpacked where cargo-deny looks for its
# default database, again whenever the snapshot changes, and `cargo deny --offline` checks
# Cargo.lock against it. The snapshot's date is printed with the result: an advisory newer
# than the snapshot is not seen. Where GitHub is reachable, `cargo deny check advisories`
# (online) supersedes this.
#
# Then the check must refuse tools/fixtures/vulnerable-lock, whose lock file holds smallvec
# 1.6.0 (RUSTSEC-2021-0003): a database that is empty, unreadable or not consulted would
# otherwise pass everything.

SW_ADVISORIES_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# The directory cargo-deny 0.20 uses for its default database URL (github.com/rustsec/advisory-db).
SW_ADVISORY_DB="${CARGO_HOME:-$HOME/.cargo}/advisory-dbs/advisory-db-3157b0e258782691"

sw_advisories_snapshot() {
    local f
    for f in "${SW_RUSTSEC_SNAPSHOT:-}" "$SW_ADVISORIES_ROOT/../shared/rustsec/advisory-db.tar.gz" \
        /work/shared/rustsec/advisory-db.tar.gz; do
        [ -n "$f" ] && [ -f "$f" ] && { echo "$f"; return 0; }
    done
    return 1
}

# Unpacks the snapshot into cargo-deny's database directory unless that holds it already.
sw_advisories_db() {
    local snapshot stamp
    snapshot="$(sw_advisories_snapshot)" || {
        echo "advisories: no RustSec snapshot (../shared/rustsec/advisory-db.tar.gz beside the checkout, or SW_RUSTSEC_SNAPSHOT)" >&2
        return 1
    }
    stamp="$(sha256sum "$snapshot" | cut -c1-16)"
    if [ "$(cat "$SW_ADVISORY_DB/.sagaworks-snapshot" 2>/dev/null)" != "$stamp" ]; then
        rm -rf "$SW_ADVISORY_DB"
        mkdir -p "$SW_ADVISORY_DB"
        tar xzf "$snapshot" -C "$SW_ADVISORY_DB" || { echo "advisories: cannot unpack $snapshot" >&2; return 1; }
        echo "$stamp" >"$SW_ADVISORY_DB/.sagaworks-snapshot"
    fi
}

sw_advisories_check() {
    local date out fixture="$SW_ADVISORIES_ROOT/tools/fixtures/vulnerable-lock/Cargo.toml"
    sw_advisories_db || return 1
    date="$(git -C "$SW_ADVISORY_DB" log -1 --format=%cd --date=short 2>/dev/null)" \
        || { echo "advisories: $SW_ADVISORY_DB is not the snapshot's git repository" >&2; return 1; }
    echo "==> cargo deny check advisories (offline, RustSec snapshot of $date)"
    cargo deny --offline --locked check advisories || {
        echo "advisories: Cargo.lock has crates with RustSec advisories (snapshot of $date; see above)" >&2
        return 1
    }
    # The fixture's crate must be in the local registry for cargo metadata, offline.
    cargo fetch --locked --manifest-path "$fixture" >/dev/null 2>&1 \
        || { echo "advisories: cannot fetch the fixture's crates from crates.io" >&2; return 1; }
    if out="$(cargo deny --offline --locked --manifest-path "$fixture" check advisories 2>&1)"; then
        echo "advisories: the check passed tools/fixtures/vulnerable-lock (smallvec 1.6.0); it must refuse it" >&2
        return 1
    fi
    grep -q 'RUSTSEC-2021-0003' <<<"$out" || {
        echo "advisories: the fixture was refused, but not for RUSTSEC-2021-0003:" >&2
        echo "$out" >&2
        return 1
    }
    echo "    and it refuses tools/fixtures/vulnerable-lock (smallvec 1.6.0: RUSTSEC-2021-0003)"
}
