/*
 * mailrail_degree_cxx: the degree count of tools/graph/mailrail_graph.c
 * through mailrail.hpp's handlers, in YGM's style.
 *
 *   mpiexec -n 4 mailrail_degree_cxx [-v VERTICES] [-e EDGES] [-S SEED]
 *
 * Every rank draws EDGES random edges (u, v) over VERTICES vertices
 * (block-partitioned over the ranks) and sends, for each end, an increment to
 * the end's owner with async(); the handler counts it. After quiescence every
 * vertex's degree is checked against a serial count of every rank's edges.
 */
#include <mailrail.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <unistd.h>
#include <vector>

namespace {

std::uint64_t next_random(std::uint64_t &x)
{
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    return x * 0x2545F4914F6CDD1Dull;
}

struct edge {
    std::uint64_t u, v;
};

/* The EDGES edges of `rank`: the same on every rank that draws them. */
std::vector<edge> edges_of(int rank, unsigned seed, std::uint64_t vertices, long count)
{
    std::uint64_t rng = 0x9e3779b97f4a7c15ull ^ (static_cast<std::uint64_t>(seed) << 24) ^
                        static_cast<std::uint64_t>(rank);
    std::vector<edge> out(static_cast<std::size_t>(count));
    for (auto &e : out) {
        e.u = next_random(rng) % vertices;
        e.v = next_random(rng) % vertices;
    }
    return out;
}

} // namespace

int main(int argc, char **argv)
{
    std::uint64_t vertices = 1000;
    long edges = 20000;
    unsigned seed = 1;
    int c;
    while ((c = getopt(argc, argv, "v:e:S:")) != -1) {
        switch (c) {
        case 'v': vertices = std::strtoull(optarg, nullptr, 10); break;
        case 'e': edges = std::atol(optarg); break;
        case 'S': seed = static_cast<unsigned>(std::strtoul(optarg, nullptr, 10)); break;
        default: std::fprintf(stderr, "usage: mailrail_degree_cxx [-v vertices] [-e edges] [-S seed]\n");
                 return 2;
        }
    }
    if (vertices == 0 || edges < 0) {
        std::fprintf(stderr, "mailrail_degree_cxx: -v must be above 0 and -e not negative\n");
        return 2;
    }
    try {
        mailrail::session world; /* mr_init(): MailRail starts MPI itself. */
        const int rank = world.rank(), size = world.size();
        const std::uint64_t per_rank = (vertices + static_cast<std::uint64_t>(size) - 1) / size;
        const std::uint64_t base = per_rank * static_cast<std::uint64_t>(rank);
        auto owner = [&](std::uint64_t v) { return static_cast<int>(v / per_rank); };
        std::vector<std::uint64_t> degree(per_rank);

        auto add_degree = world.add_handler([&](std::uint64_t v) { degree[v - base]++; });
        world.check_handlers();
        for (const edge &e : edges_of(rank, seed, vertices, edges)) {
            world.async(owner(e.u), add_degree, e.u);
            world.async(owner(e.v), add_degree, e.v);
        }
        world.quiesce();

        /* Every vertex this rank owns, against a serial count of all the edges. */
        std::vector<std::uint64_t> expect(per_rank);
        for (int r = 0; r < size; r++) {
            for (const edge &e : edges_of(r, seed, vertices, edges)) {
                if (owner(e.u) == rank) expect[e.u - base]++;
                if (owner(e.v) == rank) expect[e.v - base]++;
            }
        }
        long wrong = 0;
        std::uint64_t sum = 0;
        for (std::uint64_t i = 0; i < per_rank; i++) {
            wrong += degree[i] != expect[i];
            sum += degree[i];
        }
        mr_stats_t st = world.stats();
        std::printf("rank %d: %llu degrees summed, %llu handler calls, %ld vertices differ from the "
                    "serial count\n", rank, static_cast<unsigned long long>(sum),
                    static_cast<unsigned long long>(st.handler_calls), wrong);
        if (wrong != 0) return 1;
    } catch (const mailrail::error &e) {
        std::fprintf(stderr, "mailrail_degree_cxx: %s\n", e.what());
        return 1;
    }
    return 0;
}
