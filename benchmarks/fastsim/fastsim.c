/* fastsim: a minimal OpenAI-compatible streaming server in C, for benchmarks/client_capacity.py
 * when `loadgen sim` (Python) cannot hold its own schedule at the rates being measured.
 *
 * The same contract as `loadgen sim`: token i of a request that arrived at a is sent at
 * a + ttft + i * itl (absolute deadlines, never early), `max_tokens` honoured exactly, usage on
 * every chunk, then [DONE]. It records the true time every token left (after send() returned)
 * and answers GET /stats with percentiles of the true TTFT (first token sent - request read),
 * true ITL (gap between consecutive sends of a stream), true TPOT (a request's last token sent
 * less its first, over its tokens less one) and lateness against the deadline,
 * in microseconds; GET /stats?reset=1 also clears them.
 *
 *   cc -O2 -pthread -o fastsim benchmarks/fastsim/fastsim.c && ./fastsim PORT TTFT_US ITL_US [THREADS]
 *
 * THREADS (1 by default) serve the port together (SO_REUSEPORT: the kernel spreads connections
 * over them), each pinned to its own core of those the process may run on, so one server can
 * outrun several client cores; /stats merges every thread's samples (and gives the requests
 * each thread took, `thread_requests`). Each thread: epoll, a timerfd armed just before the
 * earliest deadline (timer slack 1 us) and a poll without sleeping for the last 0.3 ms, a
 * binary heap of streams by deadline. HTTP/1.1 keep-alive, one request at a time per
 * connection. Past its capacity it works as an engine does: each pass sends at most a token per
 * stream, the most overdue first, then reads its sockets, so new requests are taken in at every
 * step and every stream falls behind together.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    int fd;
    char in[65536];
    size_t in_len;
    char *out;
    size_t out_len, out_cap;
    int active, heap_at;
    int64_t arrival, deadline, first_sent, last_sent;
    int next, max_tokens, prompt_tokens;
} conn_t;

static int64_t ttft_ns, itl_ns;
/* each thread's own streams, epoll set and timer */
static __thread conn_t **heap;
static __thread int heap_n, heap_cap;
static __thread int epfd, tfd;

typedef struct { int64_t *v; size_t n, cap; } samples_t;
/* each thread's samples, under its lock (taken by the thread per token, and by /stats to merge) */
typedef struct {
    pthread_mutex_t lock;
    samples_t ttft, itl, tpot, late;
    long long requests, tokens;
} stats_t;
#define MAX_THREADS 256
static stats_t all_stats[MAX_THREADS];
static int n_threads = 1;
static __thread stats_t *st;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void add_sample(samples_t *s, int64_t v) {
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 65536;
        s->v = realloc(s->v, s->cap * sizeof(int64_t));
    }
    s->v[s->n++] = v;
}

static int cmp64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* every thread's samples of one kind, in one array (the caller frees it) */
static samples_t merged(size_t offset) {
    samples_t m = {0};
    for (int t = 0; t < n_threads; t++) {
        samples_t *s = (samples_t *)((char *)&all_stats[t] + offset);
        m.cap += s->n;
    }
    m.v = malloc((m.cap ? m.cap : 1) * sizeof(int64_t));
    for (int t = 0; t < n_threads; t++) {
        samples_t *s = (samples_t *)((char *)&all_stats[t] + offset);
        memcpy(m.v + m.n, s->v, s->n * sizeof(int64_t));
        m.n += s->n;
    }
    return m;
}

static int pct_json(char *buf, size_t cap, const char *name, samples_t *s) {
    if (!s->n) return snprintf(buf, cap, "\"%s\":{\"count\":0}", name);
    qsort(s->v, s->n, sizeof(int64_t), cmp64);
    double q[] = {0.5, 0.9, 0.99, 0.999};
    const char *k[] = {"p50", "p90", "p99", "p999"};
    int w = snprintf(buf, cap, "\"%s\":{\"count\":%zu", name, s->n);
    for (int i = 0; i < 4; i++) {
        /* linear interpolation between closest ranks, as numpy's default */
        double pos = q[i] * (double)(s->n - 1);
        size_t lo = (size_t)pos;
        size_t hi = lo + 1 < s->n ? lo + 1 : lo;
        double v = (double)s->v[lo] + (pos - (double)lo) * (double)(s->v[hi] - s->v[lo]);
        w += snprintf(buf + w, cap - w, ",\"%s\":%.3f", k[i], v / 1e6);
    }
    w += snprintf(buf + w, cap - w, ",\"max\":%.3f}", (double)s->v[s->n - 1] / 1e6);
    return w;
}

/* heap of active streams by deadline */
static void heap_swap(int a, int b) {
    conn_t *t = heap[a]; heap[a] = heap[b]; heap[b] = t;
    heap[a]->heap_at = a; heap[b]->heap_at = b;
}
static void heap_up(int i) {
    while (i > 0) {
        int p = (i - 1) / 2;
        if (heap[p]->deadline <= heap[i]->deadline) break;
        heap_swap(i, p); i = p;
    }
}
static void heap_down(int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < heap_n && heap[l]->deadline < heap[m]->deadline) m = l;
        if (r < heap_n && heap[r]->deadline < heap[m]->deadline) m = r;
        if (m == i) break;
        heap_swap(i, m); i = m;
    }
}
static void heap_push(conn_t *c) {
    if (heap_n == heap_cap) {
        heap_cap = heap_cap ? heap_cap * 2 : 1024;
        heap = realloc(heap, heap_cap * sizeof(conn_t *));
    }
    heap[heap_n] = c; c->heap_at = heap_n++; heap_up(c->heap_at);
}
static void heap_remove(conn_t *c) {
    int i = c->heap_at;
    if (i < 0) return;
    heap_n--;
    if (i != heap_n) {
        heap[i] = heap[heap_n]; heap[i]->heap_at = i;
        heap_down(i); heap_up(i);
    }
    c->heap_at = -1;
}

/* the timer wakes SPIN_NS before the earliest deadline; the loop then polls without
   sleeping until it, since a sleeping thread wakes up to a millisecond late on a VM */
#define SPIN_NS 300000LL

static void arm_timer(void) {
    struct itimerspec its = {0};
    if (heap_n) {
        int64_t d = heap[0]->deadline - SPIN_NS;
        its.it_value.tv_sec = d / 1000000000LL;
        its.it_value.tv_nsec = d % 1000000000LL;
        if (!its.it_value.tv_sec && !its.it_value.tv_nsec) its.it_value.tv_nsec = 1;
    }
    timerfd_settime(tfd, TFD_TIMER_ABSTIME, &its, NULL);
}

static void close_conn(conn_t *c) {
    heap_remove(c);
    epoll_ctl(epfd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    free(c->out);
    free(c);
}

/* write what is buffered; returns -1 when the connection is gone */
static int flush_out(conn_t *c) {
    while (c->out_len) {
        ssize_t w = send(c->fd, c->out, c->out_len, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.ptr = c};
                epoll_ctl(epfd, EPOLL_CTL_MOD, c->fd, &ev);
                return 0;
            }
            return -1;
        }
        memmove(c->out, c->out + w, c->out_len - (size_t)w);
        c->out_len -= (size_t)w;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
    epoll_ctl(epfd, EPOLL_CTL_MOD, c->fd, &ev);
    return 0;
}

static void out_append(conn_t *c, const char *data, size_t n) {
    if (c->out_len + n > c->out_cap) {
        c->out_cap = (c->out_len + n) * 2;
        c->out = realloc(c->out, c->out_cap);
    }
    memcpy(c->out + c->out_len, data, n);
    c->out_len += n;
}

/* an SSE event as one HTTP chunk */
static void out_event(conn_t *c, const char *data, int n) {
    char head[32];
    int h = snprintf(head, sizeof head, "%x\r\n", n + 8);
    out_append(c, head, (size_t)h);
    out_append(c, "data: ", 6);
    out_append(c, data, (size_t)n);
    out_append(c, "\n\n\r\n", 4);
}

static int send_token(conn_t *c) {
    char buf[512];
    int i = c->next, last = i + 1 == c->max_tokens;
    int n = snprintf(buf, sizeof buf,
        "{\"id\":\"cmpl-fastsim\",\"object\":\"text_completion\",\"created\":0,\"model\":\"loadgen-sim\","
        "\"choices\":[{\"index\":0,\"text\":\" tok\",\"logprobs\":null,\"finish_reason\":%s}],"
        "\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d}}",
        last ? "\"length\"" : "null", c->prompt_tokens, i + 1, c->prompt_tokens + i + 1);
    out_event(c, buf, n);
    if (last) {
        out_event(c, "[DONE]", 6);
        out_append(c, "0\r\n\r\n", 5);
    }
    if (flush_out(c) < 0) return -1;
    int64_t sent = now_ns();
    pthread_mutex_lock(&st->lock);
    add_sample(&st->late, sent - c->deadline);
    if (i == 0) {
        add_sample(&st->ttft, sent - c->arrival);
        c->first_sent = sent;
    } else {
        add_sample(&st->itl, sent - c->last_sent);
    }
    if (last && i > 0) add_sample(&st->tpot, (sent - c->first_sent) / i);
    st->tokens++;
    pthread_mutex_unlock(&st->lock);
    c->last_sent = sent;
    c->next++;
    if (last) {
        c->active = 0;
        heap_remove(c);
    } else {
        c->deadline = c->arrival + ttft_ns + (int64_t)c->next * itl_ns;
        heap_down(c->heap_at);
    }
    return 0;
}

static int json_int(const char *body, const char *key, int dflt) {
    const char *p = strstr(body, key);
    if (!p) return dflt;
    p += strlen(key);
    while (*p == ' ' || *p == ':' || *p == '"') p++;
    return atoi(p);
}

static void respond(conn_t *c, const char *status, const char *type, const char *body) {
    char head[256];
    size_t n = strlen(body);
    int h = snprintf(head, sizeof head, "HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n\r\n",
                     status, type, n);
    out_append(c, head, (size_t)h);
    out_append(c, body, n);
}

/* handle one complete request in c->in; returns bytes consumed, 0 if incomplete, -1 on error */
static long handle_request(conn_t *c, int64_t now) {
    c->in[c->in_len] = 0;
    char *end = strstr(c->in, "\r\n\r\n");
    if (!end) return 0;
    size_t head_len = (size_t)(end - c->in) + 4;
    long clen = 0;
    char *cl = strcasestr(c->in, "content-length:");
    if (cl && cl < end) clen = atol(cl + 15);
    if (c->in_len < head_len + (size_t)clen) return 0;
    char *body = c->in + head_len;
    char saved = body[clen];
    body[clen] = 0;
    if (!strncmp(c->in, "POST ", 5) && strstr(c->in, "/completions")) {
        if (c->active) return -1;
        pthread_mutex_lock(&st->lock);
        st->requests++;
        pthread_mutex_unlock(&st->lock);
        c->max_tokens = json_int(body, "\"max_tokens\"", 16);
        if (c->max_tokens < 1) c->max_tokens = 1;
        c->prompt_tokens = 0;
        char *p = strstr(body, "\"prompt\"");
        if (p && (p = strchr(p, '['))) {
            c->prompt_tokens = 1;
            for (char *q = p; *q && *q != ']'; q++) c->prompt_tokens += *q == ',';
        }
        const char *h = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                        "Transfer-Encoding: chunked\r\n\r\n";
        out_append(c, h, strlen(h));
        c->arrival = now; c->next = 0; c->active = 1;
        c->deadline = now + ttft_ns;
        heap_push(c);
    } else if (!strncmp(c->in, "GET /v1/models", 14)) {
        respond(c, "200 OK", "application/json",
                "{\"object\":\"list\",\"data\":[{\"id\":\"loadgen-sim\",\"object\":\"model\",\"created\":0,"
                "\"owned_by\":\"loadgen\",\"max_model_len\":1000000}]}");
    } else if (!strncmp(c->in, "GET /health", 11)) {
        respond(c, "200 OK", "text/plain", "");
    } else if (!strncmp(c->in, "GET /stats", 10)) {
        static __thread char buf[4096];
        int reset = strstr(c->in, "reset=1") != NULL;
        long long requests = 0, tokens = 0;
        char per_thread[1024];
        int pw = 0;
        for (int t = 0; t < n_threads; t++) pthread_mutex_lock(&all_stats[t].lock);
        samples_t m[4] = {merged(offsetof(stats_t, ttft)), merged(offsetof(stats_t, itl)),
                          merged(offsetof(stats_t, tpot)), merged(offsetof(stats_t, late))};
        for (int t = 0; t < n_threads; t++) {
            stats_t *s = &all_stats[t];
            requests += s->requests;
            tokens += s->tokens;
            if (pw < (int)sizeof per_thread - 24)
                pw += snprintf(per_thread + pw, sizeof per_thread - pw, "%s%lld", t ? "," : "", s->requests);
            if (reset) {
                s->ttft.n = s->itl.n = s->tpot.n = s->late.n = 0;
                s->requests = s->tokens = 0;
            }
        }
        for (int t = n_threads - 1; t >= 0; t--) pthread_mutex_unlock(&all_stats[t].lock);
        int w = snprintf(buf, sizeof buf, "{\"requests\":%lld,\"tokens\":%lld,\"thread_requests\":[%s],",
                         requests, tokens, per_thread);
        w += pct_json(buf + w, sizeof buf - w, "ttft_ms", &m[0]); buf[w++] = ',';
        w += pct_json(buf + w, sizeof buf - w, "itl_ms", &m[1]); buf[w++] = ',';
        w += pct_json(buf + w, sizeof buf - w, "tpot_ms", &m[2]); buf[w++] = ',';
        w += pct_json(buf + w, sizeof buf - w, "late_ms", &m[3]);
        snprintf(buf + w, sizeof buf - w, "}");
        for (int k = 0; k < 4; k++) free(m[k].v);
        respond(c, "200 OK", "application/json", buf);
    } else {
        respond(c, "404 Not Found", "application/json", "{\"error\":{\"message\":\"no route\"}}");
    }
    body[clen] = saved;
    return (long)(head_len + (size_t)clen);
}

typedef struct { int index, listener, core; } thread_arg_t;

static void *serve(void *p);

int main(int argc, char **argv) {
    if (argc != 4 && argc != 5) {
        fprintf(stderr, "usage: fastsim PORT TTFT_US ITL_US [THREADS]\n");
        return 2;
    }
    int port = atoi(argv[1]);
    ttft_ns = atoll(argv[2]) * 1000LL;
    itl_ns = atoll(argv[3]) * 1000LL;
    n_threads = argc == 5 ? atoi(argv[4]) : 1;
    if (n_threads < 1 || n_threads > MAX_THREADS) {
        fprintf(stderr, "fastsim: THREADS is 1 to %d\n", MAX_THREADS);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    /* a connection per stream: as many descriptors as the system lets this process have */
    struct rlimit files;
    if (!getrlimit(RLIMIT_NOFILE, &files) && files.rlim_cur < files.rlim_max) {
        files.rlim_cur = files.rlim_max;
        setrlimit(RLIMIT_NOFILE, &files);
    }
    /* the cores this process may run on: with several threads, thread i is pinned to the i-th
       (round robin); one thread runs where the process may */
    cpu_set_t allowed;
    int cores[CPU_SETSIZE], n_cores = 0;
    sched_getaffinity(0, sizeof allowed, &allowed);
    for (int k = 0; k < CPU_SETSIZE; k++)
        if (CPU_ISSET(k, &allowed)) cores[n_cores++] = k;
    /* every listener bound before any thread serves: ready means all of them are */
    static thread_arg_t args[MAX_THREADS];
    for (int t = 0; t < n_threads; t++) {
        int ls = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        int one = 1;
        setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        setsockopt(ls, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
        struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                                   .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        if (bind(ls, (struct sockaddr *)&addr, sizeof addr) || listen(ls, 4096)) {
            perror("fastsim: bind/listen");
            return 1;
        }
        pthread_mutex_init(&all_stats[t].lock, NULL);
        args[t] = (thread_arg_t){t, ls, n_threads > 1 && n_cores > 1 ? cores[t % n_cores] : -1};
    }
    fprintf(stderr, "fastsim: listening on 127.0.0.1:%d with %d thread(s)\n", port, n_threads);
    pthread_t threads[MAX_THREADS];
    for (int t = 1; t < n_threads; t++) pthread_create(&threads[t], NULL, serve, &args[t]);
    serve(&args[0]);
    return 0;
}

static void *serve(void *p) {
    thread_arg_t *arg = p;
    int ls = arg->listener, one = 1;
    st = &all_stats[arg->index];
    if (arg->core >= 0) {
        cpu_set_t mine;
        CPU_ZERO(&mine);
        CPU_SET(arg->core, &mine);
        pthread_setaffinity_np(pthread_self(), sizeof mine, &mine);
    }
    epfd = epoll_create1(0);
    tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    epoll_ctl(epfd, EPOLL_CTL_ADD, ls, &ev);
    static int tmark;
    ev.data.ptr = &tmark;
    epoll_ctl(epfd, EPOLL_CTL_ADD, tfd, &ev);
    struct epoll_event events[256];
    for (;;) {
        int timeout = -1;
        if (heap_n && heap[0]->deadline - now_ns() <= SPIN_NS) timeout = 0;
        int n = epoll_wait(epfd, events, 256, timeout);
        for (int k = 0; k < n; k++) {
            void *p = events[k].data.ptr;
            if (p == NULL) {
                for (;;) {
                    int fd = accept4(ls, NULL, NULL, SOCK_NONBLOCK);
                    if (fd < 0) break;
                    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    conn_t *c = calloc(1, sizeof(conn_t));
                    c->fd = fd; c->heap_at = -1;
                    struct epoll_event cev = {.events = EPOLLIN, .data.ptr = c};
                    epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &cev);
                }
                continue;
            }
            if (p == &tmark) {
                uint64_t expirations;
                if (read(tfd, &expirations, sizeof expirations) < 0) { /* spurious */ }
                continue;
            }
            conn_t *c = p;
            if (events[k].events & EPOLLOUT) {
                if (flush_out(c) < 0) { close_conn(c); continue; }
            }
            if (events[k].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
                ssize_t r = recv(c->fd, c->in + c->in_len, sizeof c->in - 1 - c->in_len, 0);
                if (r <= 0) {
                    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) continue;
                    close_conn(c);
                    continue;
                }
                c->in_len += (size_t)r;
                int64_t t = now_ns();
                long used;
                int bad = 0;
                while (c->in_len && (used = handle_request(c, t)) != 0) {
                    if (used < 0) { bad = 1; break; }
                    memmove(c->in, c->in + used, c->in_len - (size_t)used);
                    c->in_len -= (size_t)used;
                }
                if (bad || c->in_len >= sizeof c->in - 1 || flush_out(c) < 0) close_conn(c);
            }
        }
        /* send the tokens that were due when this pass began, at most as many as there are
           streams (an engine's step: a token per running sequence), then read the sockets
           again: past its capacity the server would otherwise keep finding tokens due and
           never read a new request (they waited for the load to fall: seconds at C=2048, while
           its own count of their TTFT started only once it read them), where an engine takes
           new requests in at every step */
        int64_t t = now_ns();
        for (int budget = heap_n; budget > 0 && heap_n && heap[0]->deadline <= t; budget--) {
            conn_t *c = heap[0];
            if (send_token(c) < 0) close_conn(c);
        }
        arm_timer();
    }
    return NULL;
}
