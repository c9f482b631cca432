/* refclient: a minimal compiled streaming client, the reference benchmarks/client_capacity.py
 * holds loadgen against (--reference).
 *
 * C keep-alive connections to 127.0.0.1:PORT, each sending PER_STREAM completions requests
 * of 64 token ids back to back (closed loop), streamed. One thread, epoll; every read with
 * recvmsg and the kernel's receive stamp (SO_TIMESTAMPNS), converted to CLOCK_MONOTONIC: a
 * token's time is when its bytes arrived. A token is an SSE "data: {" line; a request ends at
 * "data: [DONE]". Prints one JSON object: requests, tokens, the window (first send to last
 * token, s), the client's CPU seconds, the reads that carried more than one token, and every
 * TTFT, ITL and TPOT (last token less first, over the tokens less one) in microseconds.
 *
 *   cc -O2 -o refclient benchmarks/fastsim/refclient.c && ./refclient PORT C PER_STREAM MAX_TOKENS
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    int fd, done, tokens;
    char buf[65536];
    size_t len;
    int64_t sent, first, last;
} conn_t;

typedef struct { int64_t *v; size_t n, cap; } samples_t;
static samples_t s_ttft, s_itl, s_tpot;
static char request[1024];
static int request_len;

static int64_t clock_ns(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void add(samples_t *s, int64_t v) {
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 65536;
        s->v = realloc(s->v, s->cap * sizeof(int64_t));
    }
    s->v[s->n++] = v;
}

static void send_request(conn_t *c) {
    c->sent = clock_ns(CLOCK_MONOTONIC);
    c->tokens = 0;
    if (write(c->fd, request, (size_t)request_len) != request_len) {
        perror("refclient: write");
        exit(1);
    }
}

static void print_samples(const char *name, samples_t *s) {
    printf("\"%s\":[", name);
    for (size_t i = 0; i < s->n; i++) printf(i ? ",%lld" : "%lld", (long long)(s->v[i] / 1000));
    printf("]");
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: refclient PORT C PER_STREAM MAX_TOKENS\n");
        return 2;
    }
    int port = atoi(argv[1]), n = atoi(argv[2]), per_stream = atoi(argv[3]), max_tokens = atoi(argv[4]);
    char body[512];
    int b = snprintf(body, sizeof body, "{\"model\":\"loadgen-sim\",\"max_tokens\":%d,\"stream\":true,\"prompt\":[1",
                     max_tokens);
    for (int i = 2; i <= 64; i++) b += snprintf(body + b, sizeof body - b, ",%d", i);
    b += snprintf(body + b, sizeof body - b, "]}");
    request_len = snprintf(request, sizeof request,
                           "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                           "Accept: text/event-stream\r\nContent-Length: %d\r\n\r\n%s", b, body);
    int epfd = epoll_create1(0), one = 1;
    conn_t *conns = calloc((size_t)n, sizeof(conn_t));
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                               .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    for (int i = 0; i < n; i++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(fd, (struct sockaddr *)&addr, sizeof addr)) {
            perror("refclient: connect");
            return 1;
        }
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof one);
        conns[i].fd = fd;
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &conns[i]};
        epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev);
    }
    int64_t first = clock_ns(CLOCK_MONOTONIC), end = first;
    long long tokens = 0, requests = 0, multi = 0, reads = 0;
    for (int i = 0; i < n; i++) send_request(&conns[i]);
    int active = n;
    struct epoll_event events[512];
    char control[CMSG_SPACE(sizeof(struct timespec))];
    while (active > 0) {
        int k = epoll_wait(epfd, events, 512, -1);
        for (int e = 0; e < k; e++) {
            conn_t *c = events[e].data.ptr;
            struct iovec iov = {.iov_base = c->buf + c->len, .iov_len = sizeof c->buf - c->len - 1};
            struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
                                 .msg_controllen = sizeof control};
            ssize_t got = recvmsg(c->fd, &msg, MSG_DONTWAIT);
            if (got <= 0) {
                if (got < 0 && (errno == EAGAIN || errno == EINTR)) continue;
                fprintf(stderr, "refclient: the server closed a connection\n");
                return 1;
            }
            int64_t mono = clock_ns(CLOCK_MONOTONIC), t = mono;
            for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
                if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_TIMESTAMPNS) {
                    struct timespec ts;
                    memcpy(&ts, CMSG_DATA(cm), sizeof ts);
                    t = (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec - (clock_ns(CLOCK_REALTIME) - mono);
                }
            }
            reads++;
            c->len += (size_t)got;
            c->buf[c->len] = 0;
            char *line = c->buf, *nl;
            int in_read = 0;
            while ((nl = strchr(line, '\n'))) {
                if (!strncmp(line, "data: {", 7)) {
                    if (c->tokens == 0) {
                        add(&s_ttft, t - c->sent);
                        c->first = t;
                    } else {
                        add(&s_itl, t - c->last);
                    }
                    c->last = end = t;
                    c->tokens++;
                    tokens++;
                    in_read++;
                } else if (!strncmp(line, "data: [DONE]", 12)) {
                    requests++;
                    if (c->tokens > 1) add(&s_tpot, (c->last - c->first) / (c->tokens - 1));
                    if (++c->done < per_stream) send_request(c);
                    else active--;
                }
                line = nl + 1;
            }
            multi += in_read > 1;
            c->len -= (size_t)(line - c->buf);
            memmove(c->buf, line, c->len);
        }
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double cpu = ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
    printf("{\"requests\":%lld,\"tokens\":%lld,\"span_s\":%.6f,\"cpu_s\":%.6f,\"reads\":%lld,\"multi_event_reads\":%lld,",
           requests, tokens, (end - first) / 1e9, cpu, reads, multi);
    print_samples("ttft_us", &s_ttft);
    printf(",");
    print_samples("itl_us", &s_itl);
    printf(",");
    print_samples("tpot_us", &s_tpot);
    printf("}\n");
    return 0;
}
