# Sourced by the build scripts (tests/citus/build_citus.sh, tests/slurm/build_slurm.sh):
# `install_missing NAME PACKAGE...` installs, with apt-get, those of the Debian packages that are not
# installed yet, saying which; an apt index too old for them is refreshed once. Needs root.
install_missing() {
    local who="$1" p
    shift
    local missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ "${#missing[@]}" -gt 0 ] || return 0
    echo "$who: installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
        || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
                 "${missing[@]}" >/dev/null; }
}
