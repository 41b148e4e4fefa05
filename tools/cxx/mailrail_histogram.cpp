/*
 * mailrail_histogram_cxx: tools/mailrail_histogram.c through mailrail.hpp,
 * after YGM's histo_ygm.cpp (docs/cxx.md sets them side by side).
 *
 *   mpiexec -n 4 mailrail_histogram_cxx [-s SCALE] [-i INSERTS] [-t TRIALS] [-S SEED]
 *
 * Every rank draws INSERTS uniform bin indices of a table of 2^SCALE bins
 * (block-partitioned over the ranks) with the C tool's generator and seeds,
 * then pushes each index as an item to its bin's owner, 256 at a time; owners
 * increment their bins. Each trial (after a warm-up) is timed from a barrier
 * to the end of the phase, and every bin is checked against a serial count.
 */
#define MPICH_SKIP_MPICXX 1
#define OMPI_SKIP_MPICXX 1
#include <mailrail.hpp>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <unistd.h>
#include <vector>

namespace {

/* xorshift64*, as tools/tool_common.h: the same keys as the C histogram. */
std::uint64_t next_random(std::uint64_t &x)
{
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    return x * 0x2545F4914F6CDD1Dull;
}

std::uint64_t seed_of(unsigned seed, int rank, int trial)
{
    return 0x853c49e6748fea9bull ^ (static_cast<std::uint64_t>(seed) << 20) ^
           static_cast<std::uint64_t>(rank) ^ (static_cast<std::uint64_t>(trial) << 40);
}

double now()
{
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

} // namespace

int main(int argc, char **argv)
{
    int scale = 20, trials = 3, c;
    long inserts = 1000000;
    unsigned seed = 1;
    while ((c = getopt(argc, argv, "s:i:t:S:")) != -1) {
        switch (c) {
        case 's': scale = std::atoi(optarg); break;
        case 'i': inserts = std::atol(optarg); break;
        case 't': trials = std::atoi(optarg); break;
        case 'S': seed = static_cast<unsigned>(std::strtoul(optarg, nullptr, 10)); break;
        default: std::fprintf(stderr, "usage: mailrail_histogram_cxx [-s scale] [-i inserts] "
                                      "[-t trials] [-S seed]\n");
                 return 2;
        }
    }
    if (scale < 1 || scale > 40 || inserts < 0 || trials < 1 || trials > 64) {
        std::fprintf(stderr, "mailrail_histogram_cxx: an option is out of range\n");
        return 2;
    }
    MPI_Init(&argc, &argv);
    int status = 0;
    try {
        mailrail::session world(mailrail::from_mpi, MPI_COMM_WORLD);
        const int rank = world.rank(), size = world.size();
        const std::uint64_t bins = 1ull << scale;
        const std::uint64_t per_rank = (bins + static_cast<std::uint64_t>(size) - 1) / size;
        const std::uint64_t base = per_rank * static_cast<std::uint64_t>(rank);
        /* A shift when the bins per rank are a power of two, as the C histogram does. */
        int shift = -1;
        for (int b = 0; b < 63; b++) shift = per_rank == 1ull << b ? b : shift;
        auto owner = [&](std::uint64_t key) {
            std::uint64_t o = shift >= 0 ? key >> shift : key / per_rank;
            return static_cast<int>(std::min<std::uint64_t>(o, size - 1));
        };
        std::vector<std::uint64_t> table(per_rank), keys(static_cast<std::size_t>(inserts));
        std::vector<double> secs;
        mailrail::items<std::uint64_t> counts(world);
        auto count = [&](std::uint64_t key, int) { table[key - base]++; };

        for (int trial = -1; trial < trials; trial++) {
            std::uint64_t rng = seed_of(seed, rank, trial);
            for (auto &k : keys) k = next_random(rng) & (bins - 1);
            std::fill(table.begin(), table.end(), 0);
            MPI_Barrier(MPI_COMM_WORLD);
            double start = now();
            /* Keys go in runs of 256: their owners first, then one bulk push. */
            int owners[256];
            for (std::size_t i = 0; i < keys.size();) {
                std::size_t n = std::min<std::size_t>(256, keys.size() - i);
                for (std::size_t k = 0; k < n; k++) owners[k] = owner(keys[i + k]);
                for (std::size_t done = 0; done < n;) {
                    std::size_t pushed = counts.push_many(&keys[i + done], owners + done, n - done);
                    done += pushed;
                    if (done < n) counts.for_each(count); /* Backpressure: drain, then go on. */
                }
                i += n;
            }
            counts.end_phase(count);
            double mine = now() - start, t;
            MPI_Allreduce(&mine, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);

            /* Every bin against a serial count of every rank's keys. */
            std::vector<std::uint64_t> expect(per_rank);
            for (int r = 0; r < size; r++) {
                std::uint64_t g = seed_of(seed, r, trial);
                for (long i = 0; i < inserts; i++) {
                    std::uint64_t key = next_random(g) & (bins - 1);
                    if (owner(key) == rank) expect[key - base]++;
                }
            }
            long wrong = 0, wrong_all = 0;
            for (std::uint64_t b = 0; b < per_rank; b++) wrong += table[b] != expect[b];
            MPI_Allreduce(&wrong, &wrong_all, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
            if (wrong_all != 0) {
                if (rank == 0)
                    std::fprintf(stderr, "mailrail_histogram_cxx: trial %d: %ld bins differ from "
                                         "the serial count\n", trial, wrong_all);
                status = 1;
                break;
            }
            if (trial >= 0) secs.push_back(t);
            if (rank == 0) {
                std::printf("  %-7s %10.4f s %14.0f inserts/s\n",
                            trial < 0 ? "warm-up" : std::to_string(trial).c_str(), t,
                            static_cast<double>(size) * static_cast<double>(inserts) / t);
            }
        }
        if (status == 0 && rank == 0) {
            std::sort(secs.begin(), secs.end());
            double median = secs.size() % 2 ? secs[secs.size() / 2]
                                            : (secs[secs.size() / 2 - 1] + secs[secs.size() / 2]) / 2;
            std::printf("mailrail_histogram_cxx: %d ranks over %s, %s: median %.4f s, %.0f inserts/s; "
                        "every bin agrees with the serial count\n", size, world.substrate(),
                        world.flowctl(), median,
                        static_cast<double>(size) * static_cast<double>(inserts) / median);
        }
    } catch (const mailrail::error &e) {
        std::fprintf(stderr, "mailrail_histogram_cxx: %s\n", e.what());
        status = 1;
    }
    MPI_Finalize();
    return status;
}
