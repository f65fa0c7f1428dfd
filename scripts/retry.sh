# Sourced by scripts/setup.sh and scripts/setup_tf_latest.sh, which set SETUP_TAG first.
#
# A download cut short by the network ("Connection broken: IncompleteRead", seen once in CI while
# mpi4py installed) fails a whole install. pip >= 25.1 resumes a broken file download itself
# (--resume-retries), but not every read it makes; so each install or apt-get step is tried up to
# 3 times, RETRY_PAUSE_S (10) seconds apart, before the set-up gives up.
retry() {
    local attempt
    for attempt in 1 2 3; do
        if "$@"; then return 0; fi
        if [ "$attempt" -lt 3 ]; then
            printf '[%s] attempt %s of 3 failed: %s; trying again in %s s\n' "$SETUP_TAG" "$attempt" "$*" \
                "${RETRY_PAUSE_S:-10}" >&2
            sleep "${RETRY_PAUSE_S:-10}"
        fi
    done
    printf '[%s] failed 3 times: %s\n' "$SETUP_TAG" "$*" >&2
    return 1
}
