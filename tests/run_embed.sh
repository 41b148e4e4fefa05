#!/bin/sh
# Builds the graph kernel as a user's code would: against an installed copy of
# MailRail found with `pkg-config mailrail`, compiled with mpicc outside the
# source tree. Then runs it on the known graph over TCP, which also checks that
# the installed library finds its plugins next to itself. Last, the complete
# example of docs/items.md, built the same way, and once more from a CMake
# project that finds MailRail with find_package(MailRail).
#
#   tests/run_embed.sh BUILD_DIR SOURCE_DIR MPIEXEC
set -eu
build=$1
src=$2
mpiexec=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
meson install -C "$build" --no-rebuild --destdir "$dir/root" --quiet > "$dir/install.log" 2>&1 || {
    cat "$dir/install.log"; exit 1; }
pc=$(find "$dir/root" -name mailrail.pc)
prefix=$(sed -n 's/^prefix=//p' "$pc")
export PKG_CONFIG_PATH
PKG_CONFIG_PATH=$(dirname "$pc")
flags=$(pkg-config --define-variable=prefix="$dir/root$prefix" --cflags --libs mailrail)
echo "pkg-config mailrail: $flags"
# shellcheck disable=SC2086
mpicc -std=c11 -D_GNU_SOURCE -O2 -Wall -Werror -I"$src/tools" -o "$dir/my_graph" \
    "$src/tools/graph/mailrail_graph.c" "$src/tools/graph/graph_edges.c" \
    "$src/tools/graph/graph_serial.c" $flags
libdir=$(pkg-config --define-variable=prefix="$dir/root$prefix" --variable=libdir mailrail)
# Only the installed library and its installed plugins may be used.
env -u MAILRAIL_PLUGIN_PATH LD_LIBRARY_PATH="$libdir" MAILRAIL_SUBSTRATE=tcp MPIEXEC_TIMEOUT=60 \
    timeout -k 5 90 "$mpiexec" -n 2 "$dir/my_graph" -f "$src/tests/graph/known.el" -V -q \
    > "$dir/out" 2>&1 || { cat "$dir/out"; exit 1; }
cat "$dir/out"
LD_LIBRARY_PATH="$libdir" ldd "$dir/my_graph" | grep -q "$libdir/libmailrail.so" || { echo "FAIL: not linked to the installed copy"; exit 1; }
grep -q "result: vertices=14 edges=15 triangles=5" "$dir/out"
grep -q "the serial reference agrees" "$dir/out"
echo "embedding check passed"

# The complete example of docs/items.md, as a user would build it, on 3 ranks:
# the amounts held must add up to the amounts sent.
sed -n '/^## A complete example/,/^## Handlers: the same table/p' "$src/docs/items.md" |
    sed -n '/^```c$/,/^```$/p' | sed '1d;$d' > "$dir/items_example.c"
# shellcheck disable=SC2086
mpicc -std=c11 -D_GNU_SOURCE -O2 -Wall -Werror -o "$dir/items_example" "$dir/items_example.c" $flags
env -u MAILRAIL_PLUGIN_PATH LD_LIBRARY_PATH="$libdir" MAILRAIL_SUBSTRATE=tcp MPIEXEC_TIMEOUT=60 \
    timeout -k 5 90 "$mpiexec" -n 3 "$dir/items_example" > "$dir/items_out" 2>&1 ||
    { cat "$dir/items_out"; exit 1; }
check_items_example() {
    cat "$1"
    awk '/^rank [0-9]+: sent/ { sent += $4; held += $6; ranks++ }
         END { if (ranks != 3 || sent != held || sent == 0) { print "FAIL: sums", ranks, sent, held; exit 1 } }' \
        "$1"
}
check_items_example "$dir/items_out"
echo "the items example of docs/items.md passed"

# The handler examples, built and run the same way: docs/items.md's (the same
# sums) and the README's walkers (ranks x 1,000 walkers x 9 visits in all).
run_example() { # NAME RANKS: builds $dir/NAME.c, runs it, output in $dir/NAME.out
    # shellcheck disable=SC2086
    mpicc -std=c11 -D_GNU_SOURCE -O2 -Wall -Werror -o "$dir/$1" "$dir/$1.c" $flags
    env -u MAILRAIL_PLUGIN_PATH LD_LIBRARY_PATH="$libdir" MAILRAIL_SUBSTRATE=tcp MPIEXEC_TIMEOUT=60 \
        timeout -k 5 90 "$mpiexec" -n "$2" "$dir/$1" > "$dir/$1.out" 2>&1 ||
        { cat "$dir/$1.out"; exit 1; }
}
sed -n '/^## Handlers: the same table/,/^Message handlers/p' "$src/docs/items.md" |
    sed -n '/^```c$/,/^```$/p' | sed '1d;$d' > "$dir/items_handler.c"
run_example items_handler 3
check_items_example "$dir/items_handler.out"
echo "the item handler example of docs/items.md passed"
sed -n '/A complete program, random walkers/,/^Over all ranks there are/p' "$src/README.md" |
    sed -n '/^```c$/,/^```$/p' | sed '1d;$d' > "$dir/walkers.c"
run_example walkers 3
cat "$dir/walkers.out"
awk '/^rank [0-9]+: [0-9]+ visits$/ { v += $3; ranks++ }
     END { if (ranks != 3 || v != 3 * 1000 * 9) { print "FAIL: visits", ranks, v; exit 1 } }' \
    "$dir/walkers.out"
echo "the handler example of README.md passed"

# The same example from a CMake project, as most graph and HPC codes build.
cmake_dir=$(dirname "$(find "$dir/root" -name MailRailConfig.cmake)")
mkdir "$dir/cmake_src" "$dir/cmake_build"
cp "$dir/items_example.c" "$dir/cmake_src/"
cat > "$dir/cmake_src/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.18)
project(items_example C)
set(CMAKE_C_STANDARD 11)
find_package(MailRail 0.1 REQUIRED)
add_executable(items_example items_example.c)
target_compile_options(items_example PRIVATE -Wall -Werror)
target_link_libraries(items_example PRIVATE MailRail::mailrail)
CMAKE
cmake -S "$dir/cmake_src" -B "$dir/cmake_build" -DMailRail_DIR="$cmake_dir" \
    > "$dir/cmake.log" 2>&1 && cmake --build "$dir/cmake_build" >> "$dir/cmake.log" 2>&1 ||
    { cat "$dir/cmake.log"; exit 1; }
env -u LD_LIBRARY_PATH ldd "$dir/cmake_build/items_example" | grep -q "$libdir/libmailrail.so" ||
    { echo "FAIL: the CMake build is not linked to the installed copy"; exit 1; }
env -u MAILRAIL_PLUGIN_PATH -u LD_LIBRARY_PATH MAILRAIL_SUBSTRATE=tcp MPIEXEC_TIMEOUT=60 \
    timeout -k 5 90 "$mpiexec" -n 3 "$dir/cmake_build/items_example" > "$dir/cmake_out" 2>&1 ||
    { cat "$dir/cmake_out"; exit 1; }
check_items_example "$dir/cmake_out"
echo "find_package(MailRail): the items example built with CMake passed"

# The C++ face (mailrail.hpp) as a user would build it: the degree count
# (which needs no MPI of its own) with plain g++ and `pkg-config mailrail`
# (the C++ face needs no other flags than the C library), then the histogram
# and the degree count from a CMake project through MailRail::cxx,
# warning-free; each run on 2 ranks over TCP and checked.
if ! command -v g++ > /dev/null; then
    echo "SKIP: g++ is not installed, the C++ face is not built here"
    exit 0
fi
check_cxx_degree() { # DIR: runs DIR's degree count
    env -u MAILRAIL_PLUGIN_PATH -u LD_LIBRARY_PATH MAILRAIL_SUBSTRATE=tcp MPIEXEC_TIMEOUT=60 \
        timeout -k 5 90 "$mpiexec" -n 2 "$1/degree" -v 500 -e 5000 > "$1/degree.out" 2>&1 ||
        { cat "$1/degree.out"; exit 1; }
    cat "$1/degree.out"
    awk '/^rank [0-9]+: [0-9]+ degrees summed, [0-9]+ handler calls, 0 vertices differ/ { s += $3; r++ }
         END { if (r != 2 || s != 2 * 5000 * 2) { print "FAIL: degrees", r, s; exit 1 } }' "$1/degree.out"
    env -u LD_LIBRARY_PATH ldd "$1/degree" | grep -q "$libdir/libmailrail.so" ||
        { echo "FAIL: the C++ degree count is not linked to the installed copy"; exit 1; }
}
check_cxx() { # DIR: runs DIR's histogram and degree count
    env -u MAILRAIL_PLUGIN_PATH -u LD_LIBRARY_PATH MAILRAIL_SUBSTRATE=tcp MPIEXEC_TIMEOUT=60 \
        timeout -k 5 90 "$mpiexec" -n 2 "$1/histogram" -s 12 -i 20000 -t 1 > "$1/histogram.out" 2>&1 ||
        { cat "$1/histogram.out"; exit 1; }
    grep "^mailrail_histogram_cxx: 2 ranks over tcp, .*every bin agrees with the serial count$" \
        "$1/histogram.out" || { cat "$1/histogram.out"; echo "FAIL: the C++ histogram"; exit 1; }
    env -u LD_LIBRARY_PATH ldd "$1/histogram" | grep -q "$libdir/libmailrail.so" ||
        { echo "FAIL: the C++ histogram is not linked to the installed copy"; exit 1; }
    check_cxx_degree "$1"
}
mkdir "$dir/cxx_pc"
# shellcheck disable=SC2086
g++ -std=c++17 -O2 -Wall -Wextra -pedantic -Werror -o "$dir/cxx_pc/degree" \
    "$src/tools/cxx/mailrail_degree.cpp" $flags -Wl,-rpath,"$libdir"
check_cxx_degree "$dir/cxx_pc"
echo "pkg-config mailrail: the C++ degree count built with g++ passed"

mkdir "$dir/cxx_src" "$dir/cxx_build"
cp "$src/tools/cxx/mailrail_histogram.cpp" "$src/tools/cxx/mailrail_degree.cpp" "$dir/cxx_src/"
cat > "$dir/cxx_src/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.18)
project(cxx_examples CXX)
find_package(MailRail 0.1 REQUIRED)
find_package(MPI REQUIRED COMPONENTS CXX)
add_executable(histogram mailrail_histogram.cpp)
target_link_libraries(histogram PRIVATE MailRail::cxx MPI::MPI_CXX)
add_executable(degree mailrail_degree.cpp)
target_link_libraries(degree PRIVATE MailRail::cxx)
foreach(t histogram degree)
  target_compile_options(${t} PRIVATE -Wall -Wextra -pedantic -Werror)
  set_target_properties(${t} PROPERTIES CXX_EXTENSIONS OFF)
endforeach()
CMAKE
# With clang++, whose default is C++14, the build shows that MailRail::cxx
# asks for C++17 (mailrail.hpp refuses anything older with an #error).
cxx=g++
command -v clang++ > /dev/null && cxx=clang++
cmake -S "$dir/cxx_src" -B "$dir/cxx_build" -DMailRail_DIR="$cmake_dir" -DCMAKE_CXX_COMPILER="$cxx" \
    > "$dir/cxx_cmake.log" 2>&1 && cmake --build "$dir/cxx_build" >> "$dir/cxx_cmake.log" 2>&1 ||
    { cat "$dir/cxx_cmake.log"; exit 1; }
if [ "$cxx" = clang++ ]; then
    grep -q -- "-std=c++17" "$dir/cxx_build/CMakeFiles/histogram.dir/flags.make" ||
        { echo "FAIL: MailRail::cxx did not ask for C++17"; exit 1; }
fi
check_cxx "$dir/cxx_build"
echo "find_package(MailRail): the C++ histogram and degree count built by $cxx with MailRail::cxx passed"
