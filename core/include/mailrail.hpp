/*
 * mailrail.hpp: the C++17 face of MailRail, header-only over mailrail.h and
 * mailrail_items.h (docs/cxx.md is its reference).
 *
 *     mailrail::session world;                        // mr_init() ... mr_finalize()
 *     auto visit = world.add_handler([&](std::uint64_t v, int hops) { ... });
 *     world.check_handlers();                         // collective: same handlers everywhere
 *     world.async(owner, visit, v, 3);                // YGM's async(dest, handler, args...)
 *     world.quiesce();                                // every message handled
 *
 * Errors throw mailrail::error, which carries the status and MailRail's
 * explanation of it (mr_status_string()). Backpressure (MR_AGAIN) is never an
 * exception: the calls that can meet it return a bool or an empty optional,
 * as the C API returns MR_AGAIN, and the blocking forms (async(), push() of
 * items with a drain) make progress until they can go on.
 *
 * Like the C API, everything here is for one thread per process, and the
 * objects that hold MailRail resources (messages, send buffers, aggregators)
 * must not outlive their session.
 */
#ifndef MAILRAIL_HPP
#define MAILRAIL_HPP

#if !defined(__cplusplus) || __cplusplus < 201703L
#error "mailrail.hpp needs C++17 (-std=c++17)"
#endif

#include "mailrail.h"
#include "mailrail_items.h"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace mailrail {

/* A failed MailRail call: status() is the C status, what() names the call and explains it. */
class error : public std::runtime_error {
public:
    error(mr_status_t status, const std::string &what)
        : std::runtime_error(what + ": " + mr_status_string(status)), status_(status) {}
    mr_status_t status() const noexcept { return status_; }

private:
    mr_status_t status_;
};

namespace detail {

/* Throws for a negative status; MR_OK and MR_AGAIN are returned to the caller. */
inline mr_status_t check(mr_status_t st, const char *call)
{
    if (st < 0) throw error(st, call);
    return st;
}

/* A name of T that is the same in every process of one binary, without RTTI. */
template <class T> constexpr const char *type_signature() noexcept
{
    return __PRETTY_FUNCTION__;
}

/* FNV-1a, 64 bits: the handler table's fingerprint. */
inline std::uint64_t fnv1a(std::uint64_t h, const void *data, std::size_t len) noexcept
{
    const unsigned char *p = static_cast<const unsigned char *>(data);
    for (std::size_t i = 0; i < len; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}
constexpr std::uint64_t fnv_basis = 0xcbf29ce484222325ull;

/* The parameter list of a functor's (non-generic) call operator. */
template <class M> struct call_traits;
#define MAILRAIL_CALL_TRAITS(QUALS)                                                        \
    template <class R, class C, class... A> struct call_traits<R (C::*)(A...) QUALS> {    \
        using result = R;                                                                 \
        using args = std::tuple<std::decay_t<A>...>;                                      \
    };
MAILRAIL_CALL_TRAITS()
MAILRAIL_CALL_TRAITS(const)
MAILRAIL_CALL_TRAITS(noexcept)
MAILRAIL_CALL_TRAITS(const noexcept)
#undef MAILRAIL_CALL_TRAITS

template <class F, class = void> struct functor_traits {
    static constexpr bool valid = false;
};
template <class F> struct functor_traits<F, std::void_t<decltype(&F::operator())>>
    : call_traits<decltype(&F::operator())> {
    static constexpr bool valid = true;
};

template <class... A> constexpr std::size_t packed_size() { return (std::size_t{0} + ... + sizeof(A)); }

/* Copies each argument after the previous one, without padding. */
template <class... A> void pack(unsigned char *out, const A &...a)
{
    std::size_t at = 0;
    ((std::memcpy(out + at, &a, sizeof(A)), at += sizeof(A)), ...);
}

template <class Tuple, std::size_t... I>
void unpack(Tuple &t, const unsigned char *in, std::index_sequence<I...>)
{
    std::size_t at = 0;
    ((std::memcpy(&std::get<I>(t), in + at, sizeof(std::tuple_element_t<I, Tuple>)),
      at += sizeof(std::tuple_element_t<I, Tuple>)),
     ...);
}

} // namespace detail

/* What a handler may return instead of void: `again` asks to be called again later. */
enum class handled { done, again };

/*
 * A handler's id with its argument types: what add_handler() returns and
 * async() takes. Copyable; valid for the session that made it.
 */
template <class... Args> class handler {
public:
    /* No handler yet (id -1): async() refuses it. */
    handler() = default;
    int id() const noexcept { return id_; }

private:
    friend class session;
    explicit handler(int id) : id_(id) {}
    int id_ = -1;
};

/*
 * A received message, zero copy: data() points into MailRail's receive pool
 * until the object is destroyed, which releases it (mr_release()). Movable,
 * not copyable.
 */
class message {
public:
    message(message &&o) noexcept : m_(o.m_) { o.m_.data = nullptr; }
    message &operator=(message &&o) noexcept
    {
        if (this != &o) {
            reset();
            m_ = o.m_;
            o.m_.data = nullptr;
        }
        return *this;
    }
    message(const message &) = delete;
    message &operator=(const message &) = delete;
    ~message() { reset(); }

    const void *data() const noexcept { return m_.data; }
    std::size_t size() const noexcept { return m_.length; }
    int source() const noexcept { return m_.source; }

    /* The payload as a T (copied out: the buffer need not be aligned for T). */
    template <class T> T as() const
    {
        static_assert(std::is_trivially_copyable_v<T>,
                      "mailrail::message::as<T>: T must be trivially copyable");
        if (m_.length != sizeof(T))
            throw error(MR_ERR_INVALID_PARAM, "mailrail::message::as: the payload is not one T");
        T value;
        std::memcpy(&value, m_.data, sizeof(T));
        return value;
    }

    /* Releases the buffer now (the destructor then does nothing). Throws on error. */
    void release()
    {
        void *d = m_.data;
        m_.data = nullptr;
        if (d != nullptr) detail::check(mr_release(d), "mr_release");
    }

private:
    friend class session;
    explicit message(const mr_message_t &m) noexcept : m_(m) {}
    /* A destructor cannot throw: a failed release (after finalize) is ignored. */
    void reset() noexcept
    {
        if (m_.data != nullptr) (void)mr_release(m_.data);
        m_.data = nullptr;
    }
    mr_message_t m_;
};

/*
 * A reserved send buffer of capacity() bytes (mr_reserve()). send() gives it
 * to MailRail; if it was not sent, the destructor gives it back to the pool
 * with mr_release(), which the C API allows for a reserved buffer. Movable,
 * not copyable.
 */
class send_buffer {
public:
    send_buffer(send_buffer &&o) noexcept : buf_(o.buf_), cap_(o.cap_) { o.buf_ = nullptr; }
    send_buffer &operator=(send_buffer &&o) noexcept
    {
        if (this != &o) {
            reset();
            buf_ = o.buf_;
            cap_ = o.cap_;
            o.buf_ = nullptr;
        }
        return *this;
    }
    send_buffer(const send_buffer &) = delete;
    send_buffer &operator=(const send_buffer &) = delete;
    ~send_buffer() { reset(); }

    void *data() noexcept { return buf_; }
    std::size_t capacity() const noexcept { return cap_; }
    /* True until sent or released. */
    explicit operator bool() const noexcept { return buf_ != nullptr; }

    /* Writes a trivially copyable value at byte `offset`. */
    template <class T> void write(const T &value, std::size_t offset = 0)
    {
        static_assert(std::is_trivially_copyable_v<T>,
                      "mailrail::send_buffer::write<T>: T must be trivially copyable");
        if (buf_ == nullptr) throw error(MR_ERR_BUFFER_STATE, "mailrail::send_buffer::write");
        if (offset > cap_ || sizeof(T) > cap_ - offset)
            throw error(MR_ERR_MESSAGE_TOO_LONG, "mailrail::send_buffer::write");
        std::memcpy(static_cast<unsigned char *>(buf_) + offset, &value, sizeof(T));
    }

    /*
     * Sends the first `length` bytes to `dest` (mr_send()). Never blocks and
     * never meets backpressure. On an error the buffer is still held (and
     * released by the destructor) and mailrail::error is thrown.
     */
    void send(std::size_t length, int dest)
    {
        if (buf_ == nullptr) throw error(MR_ERR_BUFFER_STATE, "mailrail::send_buffer::send");
        detail::check(mr_send(buf_, length, dest), "mr_send");
        buf_ = nullptr;
    }

    /* Gives the buffer back unsent, now. Throws on error. */
    void release()
    {
        void *b = buf_;
        buf_ = nullptr;
        if (b != nullptr) detail::check(mr_release(b), "mr_release");
    }

private:
    friend class session;
    send_buffer(void *buf, std::size_t cap) noexcept : buf_(buf), cap_(cap) {}
    void reset() noexcept
    {
        if (buf_ != nullptr) (void)mr_release(buf_);
        buf_ = nullptr;
    }
    void *buf_;
    std::size_t cap_;
};

/* Tells the session constructor that MPI is the application's: mr_init_mpi(). */
struct from_mpi_t {
    explicit from_mpi_t() = default;
};
inline constexpr from_mpi_t from_mpi{};

/*
 * The MailRail session of this process: mr_init() (or mr_init_mpi()) in the
 * constructor, mr_finalize() in the destructor. Only one exists at a time.
 * Neither copyable nor movable: the handlers registered with the C API keep
 * its address. finalize() ends it early and throws on error; the destructor
 * cannot throw and prints a failed mr_finalize() to stderr.
 */
class session {
public:
    /* mr_init(): MailRail starts MPI itself if the application has not. */
    session()
    {
        detail::check(mr_init(), "mr_init");
        register_check();
    }

    /*
     * mr_init_mpi() on an application's communicator (an MPI_Comm, passed by
     * value so that this header needs no mpi.h):
     *     mailrail::session world(mailrail::from_mpi, MPI_COMM_WORLD);
     */
    template <class Comm> session(from_mpi_t, Comm comm)
    {
        detail::check(mr_init_mpi(&comm, sizeof comm), "mr_init_mpi");
        register_check();
    }

    session(const session &) = delete;
    session &operator=(const session &) = delete;
    session(session &&) = delete;
    session &operator=(session &&) = delete;

    ~session()
    {
        pending_.clear();
        if (!finalized_) {
            mr_status_t st = mr_finalize();
            if (st != MR_OK) std::fprintf(stderr, "mailrail: mr_finalize: %s\n", mr_status_string(st));
        }
    }

    /* mr_finalize() now. Collective. Throws mailrail::error on failure. */
    void finalize()
    {
        if (finalized_) return;
        finalized_ = true;
        pending_.clear();
        detail::check(mr_finalize(), "mr_finalize");
    }

    int rank() const noexcept { return mr_rank(); }
    int size() const noexcept { return mr_size(); }
    int node_count() const noexcept { return mr_node_count(); }
    int node_of(int rank) const noexcept { return mr_node_of(rank); }
    std::size_t datagram_size() const noexcept { return mr_datagram_size(); }
    const char *substrate() const noexcept { return mr_substrate_name(); }
    const char *flowctl() const noexcept { return mr_flowctl_name(); }

    /* A send buffer, or nothing under backpressure (make progress and try again). */
    std::optional<send_buffer> reserve()
    {
        void *buf = nullptr;
        if (detail::check(mr_reserve(&buf), "mr_reserve") == MR_AGAIN) return std::nullopt;
        return send_buffer(buf, mr_datagram_size());
    }

    /* The oldest arrived message, or nothing now. Makes progress and runs handlers. */
    std::optional<message> receive()
    {
        if (!pending_.empty()) {
            message first = std::move(pending_.front());
            pending_.pop_front();
            return first;
        }
        mr_message_t m;
        mr_status_t st = mr_receive(&m);
        rethrow_handler_error();
        if (detail::check(st, "mr_receive") == MR_AGAIN) return std::nullopt;
        return message(m);
    }

    /* Progress and handlers, no message taken. True when something happened. */
    bool poll()
    {
        mr_status_t st = mr_poll();
        rethrow_handler_error();
        return detail::check(st, "mr_poll") == MR_OK;
    }

    /* Sleeps until something may be ready or `timeout_ms` passed (mr_wait()). */
    bool wait(int timeout_ms)
    {
        mr_status_t st = mr_wait(timeout_ms);
        rethrow_handler_error();
        return detail::check(st, "mr_wait") == MR_OK;
    }

    /*
     * Quiescence, blocking: makes progress, runs handlers and passes each
     * plain message (sent with send_buffer::send()) to on_message, until
     * every rank agrees that every message is handled. Collective.
     */
    template <class F> void quiesce(F &&on_message)
    {
        mr_status_t st;
        /* Those kept by quiesce() first (taken out: quiesce() puts them back). */
        std::deque<message> kept;
        kept.swap(pending_);
        for (message &m : kept) on_message(std::move(m));
        do {
            for (;;) {
                mr_message_t m;
                st = mr_receive(&m);
                rethrow_handler_error();
                if (detail::check(st, "mr_receive") == MR_AGAIN) break;
                on_message(message(m));
            }
            st = mr_quiesce();
            rethrow_handler_error();
        } while (detail::check(st, "mr_quiesce") == MR_AGAIN);
    }

    /*
     * Quiescence when the application sends no plain messages: a plain
     * message that arrives meanwhile (another rank's next phase may start
     * before this rank's quiescence returns) is kept, holding its receive
     * slot, and returned by the next receive() or quiesce(f).
     */
    void quiesce()
    {
        quiesce([this](message m) { pending_.push_back(std::move(m)); });
    }

    /* This rank's counters (mr_get_stats()). */
    mr_stats_t stats() const
    {
        mr_stats_t s{};
        s.size = sizeof s;
        detail::check(mr_get_stats(&s), "mr_get_stats");
        return s;
    }

    /* mr_connect(): collective, each rank with its own list. */
    void connect(const std::vector<int> &dests)
    {
        detail::check(mr_connect(dests.empty() ? nullptr : dests.data(), static_cast<int>(dests.size())),
                      "mr_connect");
    }

    /*
     * Registers a lambda or functor whose parameters are trivially copyable,
     * as the next handler id (0, 1, ...): every rank registers the same
     * handlers in the same order, then calls check_handlers() before the
     * first async(). The functor returns void (done) or mailrail::handled.
     * Only before check_handlers() (or between two of them, collectively).
     */
    template <class F> auto add_handler(F f)
    {
        using traits = detail::functor_traits<std::decay_t<F>>;
        static_assert(traits::valid,
                      "mailrail::session::add_handler: the handler must be a lambda or functor with "
                      "one non-template operator() (no auto parameters)");
        return add_handler_impl(std::move(f), static_cast<typename traits::args *>(nullptr));
    }

    /*
     * Collective: checks that every rank registered the same handlers (count,
     * order and signatures, by a fingerprint of their types) and arms
     * async(). On a mismatch every rank throws mailrail::error
     * (MR_ERR_INVALID_PARAM) naming two ranks that differ and their handler
     * counts. One ring pass and two quiescences: O(ranks) messages. Plain
     * messages that arrive meanwhile are kept for receive().
     */
    void check_handlers()
    {
        const unsigned gen = checks_ % 2;
        /*
         * async() is armed from the start: a rank that finished this check
         * may send before this rank's last quiescence returns, and its
         * messages may run handlers here that send. On a mismatch every rank
         * throws, and nobody sends.
         */
        const std::size_t was_checked = checked_;
        checked_ = handlers_.size();
        fingerprint mine{hash_, static_cast<std::uint32_t>(handlers_.size()), rank(), checks_, 0};
        /* Round 1: each rank sends its fingerprint to the next one around the ring. */
        send_check(mine, (rank() + 1) % size());
        quiesce();
        /* Round 2: a rank whose neighbour differs tells every rank, so that all fail together. */
        const fingerprint &prev = ring_[gen];
        if (!got_ring_[gen] || prev.hash != mine.hash || prev.count != mine.count) {
            fingerprint bad{mine.count, prev.count, -1 - mine.rank, checks_, 0};
            for (int r = 0; r < size(); r++) send_check(bad, r);
        }
        quiesce();
        /*
         * The next check's messages may reach this rank before it returns
         * from this one's quiescence: they go to the other slot.
         */
        checks_++;
        got_ring_[gen] = false;
        bool mismatch = mismatch_[gen];
        mismatch_[gen] = false;
        if (mismatch) {
            checked_ = was_checked;
            const fingerprint &bad = bad_[gen];
            int at = -1 - bad.rank, before = at == 0 ? size() - 1 : at - 1;
            throw error(MR_ERR_INVALID_PARAM,
                        "mailrail::session::check_handlers: rank " + std::to_string(at) + " (" +
                            std::to_string(bad.hash) + " handlers) and rank " +
                            std::to_string(before) + " (" + std::to_string(bad.count) +
                            ") registered " +
                            (bad.hash == bad.count ? "their handlers in another order or with other types"
                                                   : "different handlers") +
                            "; register the same ones in the same order on every rank");
        }
    }

    /*
     * Sends args to handler h at rank dest, copied (mr_send_handler_copy()).
     * Returns false under backpressure, having sent nothing: make progress
     * and call again, or return mailrail::handled::again from a handler.
     */
    template <class... Args, class... Given>
    bool try_async(int dest, const handler<Args...> &h, Given &&...given)
    {
        static_assert(sizeof...(Args) == sizeof...(Given),
                      "mailrail::session::async: the argument count differs from the handler's");
        if (h.id() < 0)
            throw error(MR_ERR_INVALID_PARAM, "mailrail::session::async: the handler object holds "
                                              "no handler (assign it from add_handler())");
        if (checked_ <= static_cast<std::size_t>(h.id()))
            throw error(MR_ERR_INVALID_PARAM, "mailrail::session::async: handler " + std::to_string(h.id()) +
                                           " was registered but not checked: call check_handlers() "
                                           "on every rank after the last add_handler()");
        unsigned char bytes[detail::packed_size<Args...>() + 1];
        detail::pack<Args...>(bytes, static_cast<Args>(std::forward<Given>(given))...);
        return detail::check(mr_send_handler_copy(bytes, detail::packed_size<Args...>(), dest, h.id()),
                             "mr_send_handler_copy") == MR_OK;
    }

    /*
     * Like try_async(), but under backpressure makes progress (running
     * handlers) until the message goes. Inside a handler it cannot make
     * progress: there, backpressure throws mailrail::error (MR_ERR_IN_HANDLER);
     * use try_async() and return handled::again instead.
     */
    template <class... Args, class... Given>
    void async(int dest, const handler<Args...> &h, Given &&...given)
    {
        while (!try_async(dest, h, given...)) {
            if (in_handler_)
                throw error(MR_ERR_IN_HANDLER, "mailrail::session::async: no send buffer is free "
                                               "inside a handler; use try_async() and return "
                                               "mailrail::handled::again");
            poll();
        }
    }

private:
    /* The C++ face's own handler id for check_handlers(); the user's start at 0. */
    static constexpr int check_id = MR_HANDLERS_MAX - 1;

    struct handler_base {
        virtual ~handler_base() = default;
    };
    template <class F, class... Args> struct handler_holder : handler_base {
        handler_holder(F fn, session *s) : f(std::move(fn)), owner(s) {}
        F f;
        session *owner;
    };

    template <class F, class... Args> auto add_handler_impl(F f, std::tuple<Args...> *)
    {
        static_assert((std::is_trivially_copyable_v<Args> && ...),
                      "mailrail::session::add_handler: every handler argument must be trivially "
                      "copyable (it travels as bytes)");
        if (handlers_.size() >= static_cast<std::size_t>(check_id))
            throw error(MR_ERR_LIMIT, "mailrail::session::add_handler: too many handlers");
        int id = static_cast<int>(handlers_.size());
        auto holder = std::make_unique<handler_holder<F, Args...>>(std::move(f), this);
        detail::check(mr_handler_register(id, &session::trampoline<F, Args...>, holder.get()),
                      "mr_handler_register");
        handlers_.push_back(std::move(holder));
        /*
         * The fingerprint: the id, the types' names and where the handler's
         * code lies in the binary relative to this class's (g++ names every
         * lambda of a function alike; all ranks run the same binary).
         */
        const char *sig = detail::type_signature<handler_holder<F, Args...>>();
        std::uintptr_t where = reinterpret_cast<std::uintptr_t>(&session::trampoline<F, Args...>) -
                               reinterpret_cast<std::uintptr_t>(&session::on_check);
        hash_ = detail::fnv1a(hash_, &id, sizeof id);
        hash_ = detail::fnv1a(hash_, sig, std::strlen(sig));
        hash_ = detail::fnv1a(hash_, &where, sizeof where);
        return handler<Args...>(id);
    }

    /* The C handler of every C++ handler: unpacks the arguments and calls the functor. */
    template <class F, class... Args>
    static mr_status_t trampoline(const mr_message_t *m, void *arg) noexcept
    {
        auto *h = static_cast<handler_holder<F, Args...> *>(arg);
        session *s = h->owner;
        if (m->length != detail::packed_size<Args...>()) {
            s->note_error(std::make_exception_ptr(error(
                MR_ERR_PROTOCOL, "mailrail: a handler's message from rank " + std::to_string(m->source) +
                                     " has " + std::to_string(m->length) + " bytes, its handler takes " +
                                     std::to_string(detail::packed_size<Args...>()) +
                                     ": were the handlers registered in another order there?")));
            return MR_OK;
        }
        std::tuple<Args...> args;
        detail::unpack(args, static_cast<const unsigned char *>(m->data),
                       std::index_sequence_for<Args...>{});
        s->in_handler_ = true;
        mr_status_t st = MR_OK;
        try {
            using R = decltype(std::apply(h->f, args));
            if constexpr (std::is_same_v<R, handled>) {
                st = std::apply(h->f, args) == handled::again ? MR_AGAIN : MR_OK;
            } else {
                static_assert(std::is_void_v<R>,
                              "mailrail: a handler returns void or mailrail::handled");
                std::apply(h->f, args);
            }
        } catch (...) {
            s->note_error(std::current_exception());
        }
        s->in_handler_ = false;
        return st;
    }

    /* check_handlers()' message: a rank's fingerprint, or (rank < 0) a mismatch notice. */
    struct fingerprint {
        std::uint64_t hash; /* In a notice: the count of the rank that found it. */
        std::uint32_t count;
        std::int32_t rank;
        std::uint32_t gen;  /* Which check_handlers() call it belongs to. */
        std::uint32_t zero; /* Padding made explicit, so that no byte sent is undefined. */
    };

    void send_check(const fingerprint &f, int dest)
    {
        while (detail::check(mr_send_handler_copy(&f, sizeof f, dest, check_id), "mr_send_handler_copy") ==
               MR_AGAIN)
            detail::check(mr_poll(), "mr_poll");
    }

    /*
     * check_handlers()' handler is registered at once, before this rank's
     * first progress call, so that no rank's fingerprint finds it missing.
     */
    void register_check()
    {
        mr_status_t st = mr_handler_register(check_id, &session::on_check, this);
        if (st != MR_OK) {
            (void)mr_finalize();
            throw error(st, "mr_handler_register");
        }
    }

    static mr_status_t on_check(const mr_message_t *m, void *arg) noexcept
    {
        session *s = static_cast<session *>(arg);
        fingerprint f;
        if (m->length != sizeof f) return MR_OK;
        std::memcpy(&f, m->data, sizeof f);
        unsigned gen = f.gen % 2;
        if (f.rank >= 0) {
            s->ring_[gen] = f;
            s->got_ring_[gen] = true;
        } else if (!s->mismatch_[gen] || f.rank > s->bad_[gen].rank) {
            /* The lowest rank that found a mismatch: every rank names the same two. */
            s->mismatch_[gen] = true;
            s->bad_[gen] = f;
        }
        return MR_OK;
    }

    /* Keeps the first exception a handler threw; the next progress call rethrows it. */
    void note_error(std::exception_ptr e) noexcept
    {
        if (!handler_error_) handler_error_ = e;
    }
    void rethrow_handler_error()
    {
        if (handler_error_) {
            std::exception_ptr e = handler_error_;
            handler_error_ = nullptr;
            std::rethrow_exception(e);
        }
    }

    std::vector<std::unique_ptr<handler_base>> handlers_;
    std::deque<message> pending_; /* Plain messages quiesce() took for receive(). */
    std::uint64_t hash_ = detail::fnv_basis;
    std::size_t checked_ = 0;
    bool finalized_ = false;
    bool in_handler_ = false;
    std::exception_ptr handler_error_;
    /* check_handlers()' state, by the parity of the check it belongs to. */
    std::uint32_t checks_ = 0;
    fingerprint ring_[2]{}, bad_[2]{};
    bool got_ring_[2] = {false, false}, mismatch_[2] = {false, false};
};

/*
 * An aggregator of items of the trivially copyable type T
 * (mailrail_items.h): mr_items_create() in the constructor, mr_items_destroy()
 * in the destructor. Every rank creates its aggregators in the same order.
 * Not copyable or movable. Must not outlive the session.
 */
template <class T> class items {
    static_assert(std::is_trivially_copyable_v<T>,
                  "mailrail::items<T>: T must be trivially copyable (items travel as bytes)");

public:
    explicit items(session &) { detail::check(mr_items_create(sizeof(T), &a_), "mr_items_create"); }
    items(const items &) = delete;
    items &operator=(const items &) = delete;
    ~items() { (void)mr_items_destroy(a_); }

    /* Pushes one item to `dest`: true if accepted, false under backpressure (drain, retry). */
    bool push(const T &value, int dest)
    {
        return detail::check(mr_items_push(a_, &value, sizeof(T), dest), "mr_items_push") == MR_OK;
    }

    /* Pushes values[k] to dests[k] for k < n, in order; returns how many went in (< n: backpressure). */
    std::size_t push_many(const T *values, const int *dests, std::size_t n)
    {
        std::size_t pushed = 0;
        detail::check(mr_items_push_many(a_, values, n, dests, &pushed), "mr_items_push_many");
        return pushed;
    }

    /*
     * Pulls every item that has arrived, calling f(const T &item, int source)
     * for each; makes progress. Returns the number of items.
     */
    template <class F> std::size_t for_each(F &&f)
    {
        std::size_t total = 0;
        const void *data;
        std::size_t n;
        int source;
        while (detail::check(mr_items_pull_block(a_, &data, &n, &source), "mr_items_pull_block") ==
               MR_OK) {
            const unsigned char *p = static_cast<const unsigned char *>(data);
            for (std::size_t k = 0; k < n; k++) {
                T value;
                std::memcpy(&value, p + k * sizeof(T), sizeof(T));
                f(static_cast<const T &>(value), source);
            }
            total += n;
        }
        return total;
    }

    /* Pushes, draining with f (as for_each()) while backpressure lasts. */
    template <class F> void push(const T &value, int dest, F &&drain)
    {
        while (!push(value, dest)) for_each(drain);
    }

    /* Sends the partly filled datagrams now. */
    void flush() { detail::check(mr_items_flush(a_), "mr_items_flush"); }

    /*
     * Ends the phase (collective): drains with f until every item pushed by
     * any rank has been pulled (mr_items_end_phase()).
     */
    template <class F> void end_phase(F &&f)
    {
        do {
            for_each(f);
        } while (detail::check(mr_items_end_phase(a_), "mr_items_end_phase") == MR_AGAIN);
    }

    mr_items_t *native() noexcept { return a_; }

private:
    mr_items_t *a_ = nullptr;
};

} // namespace mailrail

#endif /* MAILRAIL_HPP */
