#!/bin/sh
# mailrail.hpp and its examples compile without a warning under clang++
# (-std=c++17 -Wall -Wextra -pedantic -Werror; the meson build compiles them
# with g++ and the same flags, tools/cxx/meson.build), and under both
# compilers a type that is not trivially copyable is refused with a clear
# static_assert, for items and for handler arguments. A compiler that is
# missing fails the test under MR_TEST_STRICT=1 (CI) and skips it otherwise.
#
#   tests/run_cxx_compile.sh SOURCE_DIR
set -eu
src=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mpi_flags=$(pkg-config --cflags mpich)
flags="-std=c++17 -Wall -Wextra -pedantic -Werror -I$src/core/include"
compilers=0
for cxx in g++ clang++; do
    if ! command -v "$cxx" > /dev/null; then
        echo "$cxx is not installed"
        [ "${MR_TEST_STRICT:-0}" = 1 ] && { echo "FAIL: $cxx is missing"; exit 1; }
        continue
    fi
    compilers=$((compilers + 1))
    if [ "$cxx" = clang++ ]; then
        for f in "$src"/tools/cxx/*.cpp; do
            # shellcheck disable=SC2086
            "$cxx" $flags $mpi_flags -fsyntax-only "$f" || { echo "FAIL: $cxx $f"; exit 1; }
        done
        echo "$cxx: mailrail.hpp and tools/cxx/*.cpp compile without a warning"
    fi
    # Refusals: each snippet must fail with its static_assert's message.
    refuse() { # NAME MESSAGE CODE
        printf '#include <mailrail.hpp>\n#include <string>\nvoid f(mailrail::session &w) { %s }\n' \
            "$3" > "$dir/$1.cpp"
        # shellcheck disable=SC2086
        if "$cxx" $flags -fsyntax-only "$dir/$1.cpp" > "$dir/$1.log" 2>&1; then
            echo "FAIL: $cxx accepted $1"; exit 1
        fi
        grep -qF "$2" "$dir/$1.log" || { cat "$dir/$1.log"; echo "FAIL: $cxx: $1 without '$2'"; exit 1; }
        echo "$cxx refuses $1: $2"
    }
    refuse items_of_string "mailrail::items<T>: T must be trivially copyable" \
        'mailrail::items<std::string> a(w);'
    refuse handler_of_string "every handler argument must be trivially copyable" \
        'w.add_handler([](std::string) {});'
    refuse generic_handler "the handler must be a lambda or functor with one non-template operator()" \
        'w.add_handler([](auto) {});'
done
[ "$compilers" -gt 0 ] || exit 77
