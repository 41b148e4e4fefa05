#!/bin/sh
# Turns Debian's package lists into an edge list for mailrail_graph: one
# vertex per package name (virtual packages included), one edge from a package
# to each package its Depends or Pre-Depends fields name (every alternative of
# an "a | b" choice, versions and architecture qualifiers stripped). Repeats
# across suites and versions are written once.
#
#   tools/graph/apt_depgraph.sh OUT.el
#
# Writes OUT.el (SNAP-style "u v" lines after '#' comments) and OUT.el.names
# ("id name" lines), and prints the graph's size and its hubs: the packages
# with the most in-edges. Needs the package lists of `apt-get update`; reads
# them through `apt-cache dumpavail`, so compressed lists work as well.
set -eu
case "${1:-}" in
    -h | --help) sed -n '2,13p' "$0"; exit 0 ;;
    -*) echo "usage: $0 OUT.el (an output file, not an option)" >&2; exit 2 ;;
esac
if [ $# -ne 1 ]; then
    echo "usage: $0 OUT.el" >&2
    exit 2
fi
out=$1
command -v apt-cache > /dev/null || { echo "$0: apt-cache not found" >&2; exit 1; }
packages=$(mktemp)
trap 'rm -f "$packages"' EXIT
apt-cache dumpavail > "$packages"
if ! grep -q '^Package:' "$packages"; then
    echo "$0: apt-cache knows no packages: run apt-get update first" >&2
    exit 1
fi
awk -v out="$out" -v names="$out.names" '
BEGIN { n = 0; m = 0 }
function id(name) {
    if (!(name in ids)) { ids[name] = n; label[n] = name; n++ }
    return ids[name]
}
function depends(field,    count, parts, i, alts, k, a, target) {
    count = split(field, parts, ",")
    for (i = 1; i <= count; i++) {
        k = split(parts[i], alts, "|")
        for (a = 1; a <= k; a++) {
            target = alts[a]
            sub(/\(.*\)/, "", target)
            sub(/\[.*\]/, "", target)
            sub(/<.*>/, "", target)
            gsub(/[ \t]/, "", target)
            sub(/:.*/, "", target)
            if (target == "" || target == pkg) continue
            edge = id(pkg) " " id(target)
            if (!(edge in seen)) { seen[edge] = 1; edges[m++] = edge; indeg[ids[target]]++ }
        }
    }
}
/^Package:/ { pkg = $2; id(pkg); next }
/^(Pre-)?Depends:/ { line = $0; sub(/^[A-Za-z-]+:[ \t]*/, "", line); depends(line); next }
END {
    printf "# Debian package dependency graph (Depends and Pre-Depends, every alternative)\n" > out
    printf "# from apt-cache dumpavail: %d package names, %d directed dependencies (a name without\n", n, m > out
    printf "# any dependency is no vertex of the graph; mutual dependencies are one undirected edge)\n" > out
    printf "# vertex names: %s\n", names > out
    for (e = 0; e < m; e++) print edges[e] > out
    for (v = 0; v < n; v++) print v, label[v] > names
    printf "package names %d, directed dependencies %d\n", n, m
    for (v = 0; v < n; v++) if (indeg[v] > 0) printf "%d %s\n", indeg[v], label[v] | "sort -rn | head -10 | sed \"s/^/in-degree /\""
}' "$packages"
