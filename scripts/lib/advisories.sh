# shellcheck shell=bash
# The RustSec advisory check: source this, then call `sw_advisories_check` (offline, against
# the machine's snapshot) or `sw_advisories_check_online` (the live database, where GitHub
# is reachable). scripts/advisories runs either, and re-pins the snapshot.
#
# These machines cannot reach GitHub, where cargo-deny clones the RustSec advisory database
# from. A snapshot of it comes with the machine (../shared/rustsec/advisory-db.tar.gz beside
# the checkout, or SW_RUSTSEC_SNAPSHOT). Before it is used:
#   * its SHA-256 must be the one pinned in scripts/lib/rustsec-snapshot.sha256 (or the file
#     SW_RUSTSEC_PIN_FILE names): another file fails, saying how to re-pin after a deliberate
#     update (`scripts/advisories --pin`);
#   * it must be at most SW_RUSTSEC_MAX_AGE_DAYS days old (default below), counted from the
#     date of the snapshot's commit (cargo-deny reads the database's HEAD commit time) to
#     today (UTC; SW_ADVISORIES_TODAY=YYYY-MM-DD stands for today): an advisory newer than
#     the snapshot is not seen, so an old snapshot fails instead of passing quietly.
# It is then unpacked where cargo-deny looks for its default database, again whenever the
# snapshot changes, and `cargo deny --offline` checks Cargo.lock against it. The snapshot's
# date and age are printed with the result.
#
# Then either check must refuse tools/fixtures/vulnerable-lock, whose lock file holds smallvec
# 1.6.0 (RUSTSEC-2021-0003): a database that is empty, unreadable or not consulted would
# otherwise pass everything.

SW_ADVISORIES_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# The directory cargo-deny 0.20 uses for its default database URL (github.com/rustsec/advisory-db).
SW_ADVISORY_DB="${CARGO_HOME:-$HOME/.cargo}/advisory-dbs/advisory-db-3157b0e258782691"
# The pinned SHA-256 of the snapshot, and the oldest snapshot accepted (days).
SW_RUSTSEC_PIN_FILE="${SW_RUSTSEC_PIN_FILE:-$SW_ADVISORIES_ROOT/scripts/lib/rustsec-snapshot.sha256}"
SW_RUSTSEC_MAX_AGE_DAYS="${SW_RUSTSEC_MAX_AGE_DAYS:-120}"

sw_advisories_err() { printf 'advisories: %s\n' "$*" >&2; }

sw_advisories_snapshot() {
    local f
    for f in "${SW_RUSTSEC_SNAPSHOT:-}" "$SW_ADVISORIES_ROOT/../shared/rustsec/advisory-db.tar.gz" \
        /work/shared/rustsec/advisory-db.tar.gz; do
        [ -n "$f" ] && [ -f "$f" ] && { echo "$f"; return 0; }
    done
    sw_advisories_err "no RustSec snapshot (../shared/rustsec/advisory-db.tar.gz beside the checkout, or SW_RUSTSEC_SNAPSHOT)"
    return 1
}

# The pinned hash: the pin file's first line that is not a comment.
sw_advisories_pinned() {
    local pin
    pin="$(grep -v -e '^#' -e '^[[:space:]]*$' "$SW_RUSTSEC_PIN_FILE" 2>/dev/null | head -n 1)"
    [[ $pin =~ ^[0-9a-f]{64}$ ]] || {
        sw_advisories_err "$SW_RUSTSEC_PIN_FILE holds no SHA-256 (64 lower-case hex digits); pin the snapshot with scripts/advisories --pin"
        return 1
    }
    echo "$pin"
}

# Fails unless the snapshot's SHA-256 is the pinned one.
sw_advisories_verify() { # snapshot
    local pinned actual
    pinned="$(sw_advisories_pinned)" || return 1
    actual="$(sha256sum "$1" | cut -d' ' -f1)"
    [ "$actual" = "$pinned" ] && return 0
    sw_advisories_err "the RustSec snapshot $1 has SHA-256 $actual, but $SW_RUSTSEC_PIN_FILE pins $pinned." \
        "It is not the snapshot this repository accepts: nothing was checked against it." \
        "After a deliberate update of the snapshot (its origin checked), re-pin it with" \
        "\`scripts/advisories --pin\` and commit the pin file."
    return 1
}

# The snapshot's date (YYYY-MM-DD) and age in days, "<date> <age>", from the unpacked
# database's HEAD commit; fails when the age is over SW_RUSTSEC_MAX_AGE_DAYS.
sw_advisories_age() {
    local epoch date today today_epoch age max="$SW_RUSTSEC_MAX_AGE_DAYS"
    [[ $max =~ ^[0-9]+$ ]] || { sw_advisories_err "SW_RUSTSEC_MAX_AGE_DAYS='$max' is not a number of days"; return 1; }
    if ! read -r epoch date < <(git -C "$SW_ADVISORY_DB" log -1 --format='%ct %cs' 2>/dev/null); then
        sw_advisories_err "$SW_ADVISORY_DB is not the snapshot's git repository"
        return 1
    fi
    today="${SW_ADVISORIES_TODAY:-$(date -u +%F)}"
    if ! [[ $today =~ ^[0-9]{4}-[0-9]{2}-[0-9]{2}$ ]] || ! today_epoch="$(date -u -d "$today" +%s 2>/dev/null)"; then
        sw_advisories_err "SW_ADVISORIES_TODAY='$today' is not a date (YYYY-MM-DD)"
        return 1
    fi
    age=$(((today_epoch - epoch) / 86400))
    if [ "$age" -gt "$max" ]; then
        sw_advisories_err "the RustSec snapshot is $age days old (its commit is of $date, today is $today):" \
            "more than the $max days allowed (SW_RUSTSEC_MAX_AGE_DAYS). Advisories published since" \
            "are not seen. Refresh ../shared/rustsec/advisory-db.tar.gz and re-pin it" \
            "(scripts/advisories --pin), or run the check online where GitHub is reachable" \
            "(scripts/advisories --online)."
        return 1
    fi
    echo "$date $age"
}

# Checks the snapshot's pin, unpacks it into cargo-deny's database directory unless that
# holds it already, and checks its age. Prints "<date> <age>".
sw_advisories_db() {
    local snapshot stamp
    snapshot="$(sw_advisories_snapshot)" || return 1
    sw_advisories_verify "$snapshot" || return 1
    stamp="$(sha256sum "$snapshot" | cut -c1-16)"
    if [ "$(cat "$SW_ADVISORY_DB/.sagaworks-snapshot" 2>/dev/null)" != "$stamp" ]; then
        rm -rf "$SW_ADVISORY_DB"
        mkdir -p "$SW_ADVISORY_DB"
        tar xzf "$snapshot" -C "$SW_ADVISORY_DB" || { sw_advisories_err "cannot unpack $snapshot"; return 1; }
        echo "$stamp" >"$SW_ADVISORY_DB/.sagaworks-snapshot"
    fi
    sw_advisories_age
}

# Fails unless cargo deny refuses tools/fixtures/vulnerable-lock for RUSTSEC-2021-0003.
sw_advisories_refuses_fixture() { # cargo-deny's flags (--offline, or none)
    local out fixture="$SW_ADVISORIES_ROOT/tools/fixtures/vulnerable-lock/Cargo.toml"
    # The fixture's crate must be in the local registry for cargo metadata, offline.
    cargo fetch --locked --manifest-path "$fixture" >/dev/null 2>&1 ||
        { sw_advisories_err "cannot fetch the fixture's crates from crates.io"; return 1; }
    if out="$(cargo deny "$@" --locked --manifest-path "$fixture" check advisories 2>&1)"; then
        sw_advisories_err "the check passed tools/fixtures/vulnerable-lock (smallvec 1.6.0); it must refuse it"
        return 1
    fi
    grep -q 'RUSTSEC-2021-0003' <<<"$out" || {
        sw_advisories_err "the fixture was refused, but not for RUSTSEC-2021-0003:"
        echo "$out" >&2
        return 1
    }
    echo "    and it refuses tools/fixtures/vulnerable-lock (smallvec 1.6.0: RUSTSEC-2021-0003)"
}

sw_advisories_check() {
    local date age
    read -r date age < <(sw_advisories_db) && [ -n "$date" ] || return 1
    echo "==> cargo deny check advisories (offline, RustSec snapshot of $date: $age days old, at most $SW_RUSTSEC_MAX_AGE_DAYS)"
    cargo deny --offline --locked check advisories || {
        sw_advisories_err "Cargo.lock has crates with RustSec advisories (snapshot of $date; see above)"
        return 1
    }
    sw_advisories_refuses_fixture --offline
}

# Against the live database, which cargo-deny fetches (GitHub must be reachable).
sw_advisories_check_online() {
    echo "==> cargo deny check advisories (online, the live RustSec database)"
    cargo deny --locked check advisories || {
        sw_advisories_err "Cargo.lock has crates with RustSec advisories (see above)"
        return 1
    }
    sw_advisories_refuses_fixture
}

# Writes the snapshot's SHA-256 into the pin file, after a deliberate update of the snapshot.
sw_advisories_pin() {
    local snapshot hash
    snapshot="$(sw_advisories_snapshot)" || return 1
    hash="$(sha256sum "$snapshot" | cut -d' ' -f1)"
    {
        grep '^#' "$SW_RUSTSEC_PIN_FILE" 2>/dev/null || true
        echo "$hash"
    } >"$SW_RUSTSEC_PIN_FILE.tmp" && mv -f "$SW_RUSTSEC_PIN_FILE.tmp" "$SW_RUSTSEC_PIN_FILE"
    echo "pinned $snapshot: $hash in $SW_RUSTSEC_PIN_FILE (commit it)"
}
