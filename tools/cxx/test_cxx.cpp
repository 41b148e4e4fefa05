/*
 * The C++ face's own checks (tests/run_cxx.sh runs them on 2 to 4 ranks):
 *
 *   mpiexec -n N test_cxx          every check below; prints "test_cxx: all checks passed"
 *   mpiexec -n N test_cxx -swap    rank 1 registers its handlers in another order:
 *                                  every rank must fail check_handlers() with MR_ERR_INVALID_PARAM
 *   mpiexec -n N test_cxx -extra   rank 0 registers one handler more: the same
 *   MAILRAIL_SEND_SLOTS=2 mpiexec -n N test_cxx -relay
 *                                  handlers that forward with try_async() under backpressure
 */
#include <mailrail.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

int failures = 0;
bool mismatch_mode = false;

#define EXPECT(cond)                                                                          \
    do {                                                                                      \
        if (!(cond)) {                                                                        \
            std::fprintf(stderr, "test_cxx: rank %d: line %d: %s is false\n", mr_rank(),      \
                         __LINE__, #cond);                                                    \
            failures++;                                                                       \
        }                                                                                     \
    } while (0)

/* No padding: every byte sent is defined (valgrind checks the bytes that leave). */
struct point {
    std::int64_t x;
    double y;
};

/* Errors: a real error throws mailrail::error with the status and MailRail's message. */
void check_errors(mailrail::session &world)
{
    auto buf = world.reserve();
    EXPECT(buf.has_value());
    try {
        buf->send(8, world.size());
        EXPECT(!"send to an invalid rank did not throw");
    } catch (const mailrail::error &e) {
        EXPECT(e.status() == MR_ERR_INVALID_RANK);
        std::string want = std::string("mr_send: ") + mr_status_string(MR_ERR_INVALID_RANK);
        EXPECT(want == e.what());
    }
    EXPECT(static_cast<bool>(*buf)); /* Still ours after the error: the destructor releases it. */
    try {
        mailrail::session second;
        EXPECT(!"a second session did not throw");
    } catch (const mailrail::error &e) {
        EXPECT(e.status() == MR_ERR_ALREADY_INITIALIZED);
    }
}

/* Send buffers go back to the pool unsent on scope exit; backpressure is an empty optional. */
void check_send_buffers(mailrail::session &world)
{
    std::size_t held = 0;
    {
        std::vector<mailrail::send_buffer> all;
        while (auto b = world.reserve()) all.push_back(std::move(*b));
        held = all.size();
        EXPECT(held > 0);
        EXPECT(!world.reserve().has_value()); /* Backpressure, no exception. */
    }
    std::vector<mailrail::send_buffer> again;
    while (auto b = world.reserve()) again.push_back(std::move(*b));
    EXPECT(again.size() == held); /* Every buffer came back. */
    again.clear();

    /* A message to the next rank, received zero copy and released on scope exit. */
    int next = (world.rank() + 1) % world.size(), prev = (world.rank() + world.size() - 1) % world.size();
    auto b = world.reserve();
    EXPECT(b.has_value());
    b->write(point{world.rank(), 0.5 * world.rank()});
    b->send(sizeof(point), next);
    EXPECT(!*b);
    const void *data = nullptr;
    {
        std::optional<mailrail::message> m;
        while (!(m = world.receive())) {
        }
        data = m->data();
        EXPECT(m->source() == prev);
        EXPECT(m->size() == sizeof(point));
        point p = m->as<point>();
        EXPECT(p.x == prev && p.y == 0.5 * prev);
        mailrail::message moved = std::move(*m); /* Moved: one owner, one release. */
        EXPECT(moved.data() == data && m->data() == nullptr);
    }
    /* The destructor released it: releasing again is refused. */
    EXPECT(mr_release(const_cast<void *>(data)) == MR_ERR_BUFFER_STATE);
    world.quiesce();

    /* A plain message that quiesce() meets is kept for receive(), not lost. */
    b = world.reserve();
    EXPECT(b.has_value());
    b->write(point{100 + world.rank(), 1.0});
    b->send(sizeof(point), next);
    world.quiesce();
    auto kept = world.receive();
    EXPECT(kept.has_value() && kept->source() == prev && kept->as<point>().x == 100 + prev);
}

/* Typed items: every rank pushes k * size + rank to rank k % size, for k < 1000. */
void check_items(mailrail::session &world)
{
    mailrail::items<point> pts(world);
    const int n = 1000;
    std::vector<int> seen(static_cast<std::size_t>(n) * world.size());
    auto take = [&](const point &p, int source) {
        EXPECT(p.x % world.size() == source);
        EXPECT(p.y == 2.0 * p.x);
        EXPECT((p.x / world.size()) % world.size() == world.rank());
        seen[static_cast<std::size_t>(p.x)]++;
    };
    for (int k = 0; k < n; k++) {
        int v = k * world.size() + world.rank();
        pts.push(point{v, 2.0 * v}, k % world.size(), take);
    }
    pts.end_phase(take);
    for (int k = 0; k < n; k++) {
        for (int r = 0; r < world.size(); r++) {
            EXPECT(seen[static_cast<std::size_t>(k * world.size() + r)] == (k % world.size() == world.rank()));
        }
    }
}

/* Handlers: typed arguments, handled::again, an exception carried out of progress. */
void check_handlers(mailrail::session &world, const char *mode)
{
    std::vector<std::uint64_t> sums(static_cast<std::size_t>(world.size()));
    int retries = 0, calls = 0;
    bool swap = std::strcmp(mode, "-swap") == 0 && world.rank() == 1;
    bool extra = std::strcmp(mode, "-extra") == 0 && world.rank() == 0;
    auto add = [&](int source, std::uint64_t v, point p) {
        sums[static_cast<std::size_t>(source)] += v;
        EXPECT(p.x == source && p.y == 1.5);
        calls++;
    };
    auto picky = [&](std::uint64_t v) {
        if (retries++ < 3) return mailrail::handled::again; /* Called again with the same value. */
        EXPECT(v == 42);
        return mailrail::handled::done;
    };
    auto boom = [&](std::int16_t code) { throw std::runtime_error("boom " + std::to_string(code)); };
    mailrail::handler<int, std::uint64_t, point> h_add;
    mailrail::handler<std::uint64_t> h_picky;
    if (swap) {
        h_picky = world.add_handler(picky);
        h_add = world.add_handler(add);
    } else {
        h_add = world.add_handler(add);
        h_picky = world.add_handler(picky);
    }
    auto h_boom = world.add_handler(boom);
    if (extra) world.add_handler([](char) {});
    try {
        world.async(0, h_add, world.rank(), std::uint64_t{1}, point{world.rank(), 1.5});
        EXPECT(!"async before check_handlers() did not throw");
    } catch (const mailrail::error &e) {
        EXPECT(e.status() == MR_ERR_INVALID_PARAM);
    }
    if (swap || extra || std::strcmp(mode, "-swap") == 0 || std::strcmp(mode, "-extra") == 0) {
        try {
            world.check_handlers();
            std::printf("test_cxx: rank %d: the mismatch went unnoticed\n", world.rank());
            failures++;
        } catch (const mailrail::error &e) {
            EXPECT(e.status() == MR_ERR_INVALID_PARAM);
            std::printf("test_cxx: rank %d: %s\n", world.rank(), e.what());
        }
        mismatch_mode = true;
        return;
    }
    world.check_handlers();
    for (int d = 0; d < world.size(); d++) {
        for (std::uint64_t v = 1; v <= 100; v++) world.async(d, h_add, world.rank(), v, point{world.rank(), 1.5});
    }
    world.async(world.rank(), h_picky, 42);
    world.quiesce();
    for (std::uint64_t s : sums) EXPECT(s == 5050);
    EXPECT(calls == 100 * world.size());
    EXPECT(retries == 4);
    mr_stats_t st = world.stats();
    EXPECT(st.handler_retries >= 3);
    /* A handler's exception comes out of the progress call that ran it. */
    world.async(world.rank(), h_boom, std::int16_t{7});
    bool caught = false;
    try {
        world.quiesce();
    } catch (const std::runtime_error &e) {
        caught = std::string(e.what()) == "boom 7";
    }
    EXPECT(caught);
    world.quiesce(); /* The phase the exception left open ends. */
}

/*
 * Handlers that send, under backpressure (run with MAILRAIL_SEND_SLOTS=2):
 * each rank starts 300 relays of 4 hops around the ring; a relay handler
 * forwards with try_async() and returns handled::again when no buffer is
 * free, so that every relay arrives once at its last rank, 4 ranks on.
 */
void check_relays(mailrail::session &world)
{
    const int relays = 300;
    int arrived = 0;
    mailrail::handler<int, int> relay;
    relay = world.add_handler([&](int origin, int hops) {
        if (hops == 0) {
            EXPECT((origin + 4) % world.size() == world.rank());
            arrived++;
            return mailrail::handled::done;
        }
        return world.try_async((world.rank() + 1) % world.size(), relay, origin, hops - 1)
                   ? mailrail::handled::done
                   : mailrail::handled::again;
    });
    world.check_handlers();
    for (int k = 0; k < relays; k++) world.async((world.rank() + 1) % world.size(), relay, world.rank(), 3);
    world.quiesce();
    EXPECT(arrived == relays);
    std::printf("test_cxx: rank %d: %d relays arrived, %llu handler retries\n", world.rank(), arrived,
                static_cast<unsigned long long>(world.stats().handler_retries));
}

} // namespace

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    try {
        mailrail::session world;
        if (argc == 1) {
            check_errors(world);
            check_send_buffers(world);
            check_items(world);
        }
        if (std::strcmp(mode, "-relay") == 0) check_relays(world);
        else check_handlers(world, mode);
        if (failures == 0 && !mismatch_mode)
            std::printf("test_cxx: rank %d: all checks passed\n", world.rank());
    } catch (const std::exception &e) {
        std::fprintf(stderr, "test_cxx: rank %d: %s\n", mr_rank(), e.what());
        return 1;
    }
    return failures == 0 ? 0 : 1;
}
