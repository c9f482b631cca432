/* The common streamed chunk read in compiled code: a completions or chat chunk of the shapes
 * servers send a token at a time, its fields taken straight from the bytes (no dict, no
 * objects for the fields nobody reads).
 *
 * ``configure(chunk_type, fallback)`` returns ``parse_chunk(data)``: a Chunk for what it knows
 * for certain, and ``fallback(data)`` (loadgen.load.sse's Python reading) for anything else:
 * invalid JSON, an error, the Responses API, reasoning, tool calls, escapes in keys, numbers it
 * does not read exactly, non-ASCII outside the text. The two must agree on every input the
 * compiled one answers: tests/unit/load/test_chunkscan.py holds it to that.
 * ``scan(data)`` is the compiled part alone (None: it would fall back).
 * ``events(read)`` reads a read of whole events at once; ``tokens(stream_type, parser_type)``
 * returns ``take(read, state, t)``, which takes such a read of plain tokens into a StreamState;
 * ``drain(epfd, offset, transports)`` (Linux) reads every ready socket of the kernel clock's epoll
 * set with its receive stamp.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>
#include "structmember.h"
#ifdef __linux__
#include <errno.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#endif

#define MAX_DEPTH 64
#define MAX_USAGE_TOKENS (1LL << 30)
#define CHUNK_FIELDS 12

typedef struct {
    const unsigned char *p, *end;
} Cur;

static PyObject *chunk_type = NULL;
static PyObject *fallback = NULL;
static PyObject *empty_tuple = NULL;
static PyObject *empty_str = NULL;

/* ============================================================================================
 * 1. JSON, read in place
 *
 * Contract: each reader starts at c->p and never reads at or past c->end; on success c->p is
 * past what it read; -1 (no exception set) for anything it does not read exactly as JSON
 * defines it, which sends the whole chunk to the Python reading.
 */
static inline void ws(Cur *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\n' || *c->p == '\r' || *c->p == '\t'))
        c->p++;
}

static inline int hex4(const unsigned char *s, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char ch = s[i];
        v <<= 4;
        if (ch >= '0' && ch <= '9') v |= ch - '0';
        else if (ch >= 'a' && ch <= 'f') v |= ch - 'a' + 10;
        else if (ch >= 'A' && ch <= 'F') v |= ch - 'A' + 10;
        else return -1;
    }
    *out = v;
    return 0;
}

/* A string at c->p (its opening quote). On success c->p is past the closing quote, *start and
 * *len are its raw contents, *escaped and *wide say whether it holds escapes or non-ASCII bytes.
 * A control character, a bad escape or an unterminated string: -1. */
static int string_raw(Cur *c, const unsigned char **start, Py_ssize_t *len, int *escaped, int *wide) {
    const unsigned char *p = c->p + 1;
    *start = p;
    *escaped = *wide = 0;
    while (p < c->end) {
        unsigned char ch = *p;
        if (ch == '"') {
            *len = p - *start;
            c->p = p + 1;
            return 0;
        }
        if (ch < 0x20) return -1;
        if (ch == '\\') {
            *escaped = 1;
            if (p + 1 >= c->end) return -1;
            unsigned char e = p[1];
            if (e == 'u') {
                unsigned v, low;
                if (p + 6 > c->end || hex4(p + 2, &v) < 0) return -1;
                p += 6;
                if (v >= 0xDC00 && v <= 0xDFFF) return -1; /* a surrogate pair's second half alone */
                if (v >= 0xD800 && v <= 0xDBFF) {           /* its first half: the second must follow */
                    if (p + 6 > c->end || p[0] != '\\' || p[1] != 'u' || hex4(p + 2, &low) < 0 || low < 0xDC00 ||
                        low > 0xDFFF)
                        return -1;
                    p += 6;
                }
                continue;
            }
            if (!strchr("\"\\/bfnrt", e) || e == 0) return -1;
            p += 2;
            continue;
        }
        if (ch >= 0x80) *wide = 1;
        p++;
    }
    return -1;
}

static void put_utf8(unsigned char **o, unsigned cp) {
    unsigned char *q = *o;
    if (cp < 0x80) *q++ = (unsigned char)cp;
    else if (cp < 0x800) {
        *q++ = 0xC0 | (cp >> 6);
        *q++ = 0x80 | (cp & 0x3F);
    } else if (cp < 0x10000) {
        *q++ = 0xE0 | (cp >> 12);
        *q++ = 0x80 | ((cp >> 6) & 0x3F);
        *q++ = 0x80 | (cp & 0x3F);
    } else {
        *q++ = 0xF0 | (cp >> 18);
        *q++ = 0x80 | ((cp >> 12) & 0x3F);
        *q++ = 0x80 | ((cp >> 6) & 0x3F);
        *q++ = 0x80 | (cp & 0x3F);
    }
    *o = q;
}

/* The text of a string's raw contents; NULL with no exception set where it cannot be read
 * exactly (invalid UTF-8, a lone surrogate): the caller falls back. */
static PyObject *string_value(const unsigned char *s, Py_ssize_t n, int escaped, int wide) {
    if (!escaped) {
        if (!wide) return PyUnicode_DecodeASCII((const char *)s, n, NULL);
        PyObject *text = PyUnicode_DecodeUTF8((const char *)s, n, NULL);
        if (text == NULL) PyErr_Clear();
        return text;
    }
    /* an escape's UTF-8 is never longer than the escape itself */
    unsigned char small[512];
    unsigned char *buf = n <= (Py_ssize_t)sizeof(small) ? small : PyMem_Malloc(n);
    if (buf == NULL) return NULL;
    unsigned char *o = buf;
    const unsigned char *p = s, *end = s + n;
    PyObject *text = NULL;
    while (p < end) {
        if (*p != '\\') {
            *o++ = *p++;
            continue;
        }
        unsigned char e = p[1];
        p += 2;
        switch (e) {
        case 'b': *o++ = '\b'; break;
        case 'f': *o++ = '\f'; break;
        case 'n': *o++ = '\n'; break;
        case 'r': *o++ = '\r'; break;
        case 't': *o++ = '\t'; break;
        case 'u': {
            unsigned cp = 0, low = 0;
            hex4(p, &cp);
            p += 4;
            if (cp >= 0xDC00 && cp <= 0xDFFF) goto done;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (p + 6 > end || p[0] != '\\' || p[1] != 'u' || hex4(p + 2, &low) < 0 || low < 0xDC00 ||
                    low > 0xDFFF)
                    goto done;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
                p += 6;
            }
            put_utf8(&o, cp);
            break;
        }
        default: *o++ = e; /* " \ / */
        }
    }
    text = PyUnicode_DecodeUTF8((const char *)buf, o - buf, NULL);
    if (text == NULL) PyErr_Clear();
done:
    if (buf != small) PyMem_Free(buf);
    return text;
}

/* A number read as JSON writes one; *integer: it has no fraction or exponent; *value: its value
 * (an integer has at most 18 digits: a longer number is left to the Python side). -1: not a number. */
static int number(Cur *c, int *integer, long long *value) {
    const unsigned char *p = c->p, *end = c->end;
    int negative = 0, digits = 0;
    long long v = 0;
    if (p < end && *p == '-') {
        negative = 1;
        p++;
    }
    if (p >= end || *p < '0' || *p > '9') return -1;
    if (*p == '0') {
        p++;
        digits = 1;
    } else {
        while (p < end && *p >= '0' && *p <= '9') {
            if (digits < 18) v = v * 10 + (*p - '0');
            digits++;
            p++;
        }
    }
    *integer = 1;
    if (p < end && *p == '.') {
        *integer = 0;
        p++;
        if (p >= end || *p < '0' || *p > '9') return -1;
        while (p < end && *p >= '0' && *p <= '9') p++;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        *integer = 0;
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        if (p >= end || *p < '0' || *p > '9') return -1;
        int exp_digits = 0;
        while (p < end && *p >= '0' && *p <= '9') {
            p++;
            exp_digits++;
        }
        /* a number that may be past a double's range (orjson refuses it) is left to the Python side */
        if (exp_digits > 2) return -1;
    }
    if (digits > 18 || (p - c->p) > 40) return -1;
    *value = negative ? -v : v;
    c->p = p;
    return 0;
}

static int literal(Cur *c, const char *word, size_t n) {
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, word, n) != 0) return -1;
    c->p += n;
    return 0;
}

/* Past the opening bracket at c->p: 1 where the closing one follows at once (it is passed over). */
static int opened(Cur *c, unsigned char close) {
    c->p++;
    ws(c);
    if (c->p < c->end && *c->p == close) {
        c->p++;
        return 1;
    }
    return 0;
}

/* After a member or an element: 1 for a comma (another follows), 0 for the closing bracket (passed
 * over), -1 for anything else. */
static int after_item(Cur *c, unsigned char close) {
    ws(c);
    if (c->p >= c->end) return -1;
    if (*c->p == ',') {
        c->p++;
        return 1;
    }
    if (*c->p == close) {
        c->p++;
        return 0;
    }
    return -1;
}

/* The members of an object at c->p ('{'): calls member(key, keylen, state) for each, positioned
 * at its value, which the callback must read or skip. Keys with escapes or non-ASCII: -1. */
typedef int (*member_fn)(Cur *c, const unsigned char *key, Py_ssize_t n, void *state);

static int members(Cur *c, member_fn member, void *state) {
    const unsigned char *key;
    Py_ssize_t n;
    int escaped, wide, more;
    if (opened(c, '}')) return 0;
    do {
        ws(c);
        if (c->p >= c->end || *c->p != '"' || string_raw(c, &key, &n, &escaped, &wide) < 0 || escaped || wide)
            return -1;
        ws(c);
        if (c->p >= c->end || *c->p != ':') return -1;
        c->p++;
        ws(c);
        if (c->p >= c->end || member(c, key, n, state) < 0) return -1;
    } while ((more = after_item(c, '}')) == 1);
    return more;
}

static int skip(Cur *c, int depth);

static int skip_member(Cur *c, const unsigned char *Py_UNUSED(key), Py_ssize_t Py_UNUSED(n), void *state) {
    return skip(c, *(int *)state + 1);
}

/* The elements after the first of an array (the first read, c->p after it): each skipped. */
static int rest_of_array(Cur *c, int depth) {
    int more;
    while ((more = after_item(c, ']')) == 1)
        if (skip(c, depth + 1) < 0) return -1;
    return more;
}

/* Any value, checked and passed over; a string with non-ASCII bytes, or a key with an escape, is
 * left to the Python side (its UTF-8 would have to be checked). -1: fall back. */
static int skip(Cur *c, int depth) {
    const unsigned char *s;
    Py_ssize_t n;
    int escaped, wide, integer;
    long long v;
    if (depth > MAX_DEPTH) return -1;
    ws(c);
    if (c->p >= c->end) return -1;
    switch (*c->p) {
    case '"':
        if (string_raw(c, &s, &n, &escaped, &wide) < 0 || wide) return -1;
        return 0;
    case '{': return members(c, skip_member, &depth);
    case '[':
        if (opened(c, ']')) return 0;
        if (skip(c, depth + 1) < 0) return -1;
        return rest_of_array(c, depth);
    case 't': return literal(c, "true", 4);
    case 'f': return literal(c, "false", 5);
    case 'n': return literal(c, "null", 4);
    default: return number(c, &integer, &v);
    }
}

#define KEY(name) (n == (Py_ssize_t)(sizeof(name) - 1) && memcmp(key, name, sizeof(name) - 1) == 0)

/* ============================================================================================
 * 2. A chunk's fields
 *
 * Contract: scan_event fills a Scan from one event's bytes, holding no references, or returns -1
 * where the Python reading must decide; scan_bytes makes the Chunk loadgen.load.sse's
 * read_chunk would make (tests/unit/load/test_chunkscan.py holds the two to that).
 */
/* a string field as it is read: its raw contents (kind 1), null (kind 0), or not seen (-1) */
typedef struct {
    const unsigned char *s;
    Py_ssize_t len;
    int escaped, wide, kind;
} Field;

/* what the chunk says, as it is read */
typedef struct {
    Field content, text, finish; /* delta.content, the choice's text, its finish_reason */
    int delta_seen, delta_object;
    int choices_seen, choices_list, has_choices, usage_seen;
    long long completion, prompt, cached;
    int completion_seen, prompt_seen, completion_set, prompt_set, details_seen, cached_seen, cached_set;
} Scan;

/* a string or null, once: -1 for anything else or a second time */
static int field(Cur *c, Field *f) {
    if (f->kind != -1) return -1;
    if (*c->p == '"') {
        f->kind = 1;
        return string_raw(c, &f->s, &f->len, &f->escaped, &f->wide);
    }
    f->kind = 0;
    return literal(c, "null", 4);
}

static int delta_member(Cur *c, const unsigned char *key, Py_ssize_t n, void *state) {
    Scan *sc = state;
    if (KEY("content")) return field(c, &sc->content);
    /* a thought, a tool call: the Python side reads them */
    if (KEY("reasoning_content") || KEY("reasoning") || KEY("tool_calls")) return -1;
    return skip(c, 3);
}

static int choice_member(Cur *c, const unsigned char *key, Py_ssize_t n, void *state) {
    Scan *sc = state;
    if (KEY("delta")) {
        if (sc->delta_seen) return -1;
        sc->delta_seen = 1;
        if (*c->p == '{') {
            sc->delta_object = 1;
            return members(c, delta_member, sc);
        }
        return literal(c, "null", 4);
    }
    if (KEY("text")) return field(c, &sc->text);
    if (KEY("finish_reason")) return field(c, &sc->finish);
    return skip(c, 3);
}

static int details_member(Cur *c, const unsigned char *key, Py_ssize_t n, void *state) {
    Scan *sc = state;
    if (KEY("cached_tokens")) {
        if (sc->cached_seen) return -1;
        sc->cached_seen = 1;
        if (*c->p == '-' || (*c->p >= '0' && *c->p <= '9')) {
            int integer;
            if (number(c, &integer, &sc->cached) < 0) return -1;
            sc->cached_set = integer; /* (a fraction is no count) */
            return 0;
        }
        return skip(c, 3); /* not a number: no count */
    }
    return skip(c, 3);
}

/* a usage count, once: an integer from 0 to MAX_USAGE_TOKENS, or null; anything else: -1 */
static int count(Cur *c, long long *value, int *seen, int *set) {
    int integer;
    if (*seen) return -1;
    *seen = 1;
    if (*c->p == 'n') return literal(c, "null", 4);
    if (number(c, &integer, value) < 0 || !integer || *value < 0 || *value > MAX_USAGE_TOKENS) return -1;
    *set = 1;
    return 0;
}

static int usage_member(Cur *c, const unsigned char *key, Py_ssize_t n, void *state) {
    Scan *sc = state;
    if (KEY("completion_tokens")) return count(c, &sc->completion, &sc->completion_seen, &sc->completion_set);
    if (KEY("prompt_tokens")) return count(c, &sc->prompt, &sc->prompt_seen, &sc->prompt_set);
    if (KEY("prompt_tokens_details")) {
        if (sc->details_seen) return -1;
        sc->details_seen = 1;
        if (*c->p == '{') return members(c, details_member, sc);
        return skip(c, 2);
    }
    return skip(c, 2);
}

static int top_member(Cur *c, const unsigned char *key, Py_ssize_t n, void *state) {
    Scan *sc = state;
    if (KEY("type") || KEY("error")) return -1;
    if (KEY("object")) {
        if (*c->p == '"') {
            const unsigned char *s;
            Py_ssize_t len;
            int escaped, wide;
            if (string_raw(c, &s, &len, &escaped, &wide) < 0 || escaped || wide) return -1;
            return (len == 5 && memcmp(s, "error", 5) == 0) ? -1 : 0;
        }
        return skip(c, 1);
    }
    if (KEY("choices")) {
        if (sc->choices_seen) return -1;
        sc->choices_seen = 1;
        if (*c->p == 'n') return literal(c, "null", 4);
        if (*c->p != '[') return -1;
        sc->choices_list = 1;
        if (opened(c, ']')) return 0;
        sc->has_choices = 1;
        ws(c);
        if (c->p >= c->end || *c->p != '{' || members(c, choice_member, sc) < 0) return -1;
        return rest_of_array(c, 1);
    }
    if (KEY("usage")) {
        if (sc->usage_seen) return -1;
        sc->usage_seen = 1;
        if (*c->p == 'n') return literal(c, "null", 4);
        if (*c->p != '{') return -1;
        return members(c, usage_member, sc);
    }
    return skip(c, 1);
}

static PyObject *int_or_none(int set, long long v) {
    if (set) return PyLong_FromLongLong(v);
    Py_RETURN_NONE;
}

/* A chunk's fields read into *sc: 0, or -1 where the Python side must read it (an exception is set
 * only where memory ran out). */
static int scan_event(const unsigned char *start, Py_ssize_t size, Scan *sc) {
    memset(sc, 0, sizeof(*sc));
    sc->content.kind = sc->text.kind = sc->finish.kind = -1;
    Cur c = {start, start + size};
    ws(&c);
    if (c.p >= c.end || *c.p != '{' || members(&c, top_member, sc) < 0) return -1;
    ws(&c);
    if (c.p != c.end) return -1;
    if (!sc->choices_list && !sc->usage_seen) return -1; /* neither: malformed, said by the Python side */
    if (sc->delta_object && sc->text.kind == 1 && sc->text.wide) {
        /* the choice's text, not read, must still be UTF-8 for the chunk to be JSON */
        PyObject *unread = string_value(sc->text.s, sc->text.len, sc->text.escaped, 1);
        if (unread == NULL) return -1;
        Py_DECREF(unread);
    }
    return 0;
}

/* the choice's text: delta.content where the delta is an object, else its "text" */
static inline Field *chosen_text(Scan *sc) {
    return sc->delta_object ? &sc->content : &sc->text;
}

/* The Chunk, NULL with no exception set where the Python side must read it. */
static PyObject *scan_bytes(const unsigned char *start, Py_ssize_t size) {
    Scan sc;
    if (scan_event(start, size, &sc) < 0) return NULL;
    PyObject *text, *finish, *completion, *prompt, *cached, *out;
    Field *chosen = chosen_text(&sc);
    if (sc.has_choices && chosen->kind == 1) {
        text = string_value(chosen->s, chosen->len, chosen->escaped, chosen->wide);
        if (text == NULL) return NULL;
    } else {
        text = Py_NewRef(empty_str);
    }
    if (sc.has_choices && sc.finish.kind == 1) {
        finish = string_value(sc.finish.s, sc.finish.len, sc.finish.escaped, sc.finish.wide);
        if (finish == NULL) {
            Py_DECREF(text);
            return NULL;
        }
    } else {
        finish = Py_NewRef(Py_None);
    }
    completion = int_or_none(sc.completion_set, sc.completion);
    prompt = int_or_none(sc.prompt_set, sc.prompt);
    cached = int_or_none(sc.cached_set, sc.cached);
    out = ((PyTypeObject *)chunk_type)->tp_alloc((PyTypeObject *)chunk_type, CHUNK_FIELDS);
    if (out == NULL || completion == NULL || prompt == NULL || cached == NULL) {
        Py_XDECREF(out);
        Py_DECREF(text);
        Py_DECREF(finish);
        Py_XDECREF(completion);
        Py_XDECREF(prompt);
        Py_XDECREF(cached);
        return NULL; /* (an exception is set: no memory) */
    }
    PyTuple_SET_ITEM(out, 0, text);
    PyTuple_SET_ITEM(out, 1, Py_NewRef(sc.has_choices ? Py_True : Py_False));
    PyTuple_SET_ITEM(out, 2, completion);
    PyTuple_SET_ITEM(out, 3, prompt);
    PyTuple_SET_ITEM(out, 4, finish);
    PyTuple_SET_ITEM(out, 5, Py_NewRef(Py_None));
    PyTuple_SET_ITEM(out, 6, Py_NewRef(Py_False));
    PyTuple_SET_ITEM(out, 7, cached);
    PyTuple_SET_ITEM(out, 8, Py_NewRef(Py_False));
    PyTuple_SET_ITEM(out, 9, Py_NewRef(Py_False));
    PyTuple_SET_ITEM(out, 10, Py_NewRef(empty_tuple));
    PyTuple_SET_ITEM(out, 11, Py_NewRef(Py_None));
    return out;
}

static PyObject *scan_chunk(PyObject *data) {
    if (!PyBytes_CheckExact(data)) return NULL;
    return scan_bytes((const unsigned char *)PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data));
}

/* ============================================================================================
 * 3. The whole events of a read
 *
 * Contract: events(read) returns the read's events when it is whole HTTP chunks of one whole SSE
 * event each, and None otherwise (the SSE parser then reads it); it reads only the bytes given.
 */
/* the largest event the fast reading of a read takes whole (the SSE parser's own bound is larger:
 * a bigger one goes to it) */
#define MAX_FAST_EVENT (1 << 20)

/* The next HTTP chunk of a read at *at, if it is whole and one whole SSE event of one "data: " line:
 * 1 with *event and *size its payload ("data: " and the blank line included), 0 at the read's end,
 * -1 where the read is otherwise (a chunk cut by the read, an extension, the last chunk, another
 * shape). */
static int next_event(const unsigned char **at, const unsigned char *end, const unsigned char **event,
                      size_t *size_out) {
    const unsigned char *p = *at;
    if (p >= end) return 0;
    size_t size = 0;
    int digits = 0;
    for (; p < end; p++, digits++) {
        unsigned char ch = *p;
        unsigned v;
        if (ch >= '0' && ch <= '9') v = ch - '0';
        else if (ch >= 'a' && ch <= 'f') v = ch - 'a' + 10;
        else if (ch >= 'A' && ch <= 'F') v = ch - 'A' + 10;
        else break;
        size = size * 16 + v;
        if (digits > 8) return -1;
    }
    if (digits == 0 || size < 8 || size > MAX_FAST_EVENT || end - p < 2 || p[0] != '\r' || p[1] != '\n') return -1;
    p += 2;
    if ((size_t)(end - p) < size + 2 || p[size] != '\r' || p[size + 1] != '\n') return -1;
    const unsigned char *e = p;
    if (memcmp(e, "data: ", 6) != 0 || e[size - 2] != '\n' || e[size - 1] != '\n' ||
        memchr(e + 6, '\n', size - 8) != NULL || memchr(e, '\r', size) != NULL)
        return -1;
    *at = p + size + 2;
    *event = e;
    *size_out = size;
    return 1;
}

static inline int is_done(const unsigned char *event, size_t size) {
    return size == 14 && memcmp(event + 6, "[DONE]", 6) == 0;
}

/* ``events(read)``: a read of a chunked event stream that is whole HTTP chunks, each one whole SSE
 * event of one "data: " line (what servers send a token at a time), as the list of its events:
 * a Chunk each, None for [DONE]. None where any part is otherwise (a chunk cut by the read, an
 * extension, the last chunk, an event of another shape, a chunk the compiled reading passes
 * on): the read then goes through the HTTP and SSE parsers. */
static PyObject *events(PyObject *Py_UNUSED(self), PyObject *data) {
    if (chunk_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "configure() first");
        return NULL;
    }
    if (!PyBytes_CheckExact(data)) Py_RETURN_NONE;
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(data);
    const unsigned char *end = p + PyBytes_GET_SIZE(data);
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    const unsigned char *event;
    size_t size;
    int found;
    while ((found = next_event(&p, end, &event, &size)) == 1) {
        PyObject *item;
        if (is_done(event, size)) {
            item = Py_NewRef(Py_None);
        } else {
            item = scan_bytes(event + 6, (Py_ssize_t)size - 8);
            if (item == NULL) {
                if (PyErr_Occurred()) {
                    Py_DECREF(out);
                    return NULL;
                }
                goto pass;
            }
        }
        int failed = PyList_Append(out, item);
        Py_DECREF(item);
        if (failed) {
            Py_DECREF(out);
            return NULL;
        }
    }
    if (found == 0 && PyList_GET_SIZE(out) > 0) return out;
pass:
    Py_DECREF(out);
    Py_RETURN_NONE;
}

/* ============================================================================================
 * 4. Plain tokens taken into a StreamState
 *
 * Contract: take writes only the StreamState and SSEParser slots named below, at the offsets
 * tokens() finds by name (a missing slot is a TypeError there, and a test checks the names);
 * a read it does not take whole is left untouched for the Python side, and one it takes leaves
 * the state the Python reading leaves (tests/unit/load/test_whole_events.py).
 */
/* StreamState's and SSEParser's slots that ``take`` reads and sets, found by ``tokens()`` */
enum {
    S_OUTCOME, S_WHOLE, S_ANSWER, S_FINAL, S_PARSER, S_CHUNK_NS, S_CHUNK_TOKENS, S_STREAMED, S_CUM,
    S_USAGE, S_PROMPT, S_CACHED, S_LIMIT, S_SENT, S_FIRST_LIMIT, S_TOTAL_LIMIT, S_FIRST_ANSWER, S_COUNT
};
static const char *stream_slots[S_COUNT] = {
    "outcome", "whole", "answer", "final", "parser", "chunk_ns", "chunk_tokens", "streamed", "cum_tokens",
    "usage_completion", "prompt_tokens", "cached_tokens", "token_limit", "sent_ns", "first_limit_ns",
    "total_limit_ns", "first_answer_ns"};
enum { P_BUF, P_PARTS, P_DATA, P_COUNT };
static const char *parser_slots[P_COUNT] = {"_buf", "_parts", "_data"};
static Py_ssize_t stream_at[S_COUNT], parser_at[P_COUNT];
static PyTypeObject *stream_type = NULL, *parser_type = NULL;

#define SLOT(obj, at) (*(PyObject **)((char *)(obj) + (at)))
/* the most token events one read takes in compiled code (a read with more goes to the Python side) */
#define MAX_TAKE 512

/* a slot that holds an int (*none: or None, where allowed); -1 where it holds anything else */
static int int_slot(PyObject *obj, Py_ssize_t at, long long *value, int *none) {
    PyObject *v = SLOT(obj, at);
    if (v == NULL) return -1;
    if (v == Py_None && none != NULL) {
        *none = 1;
        return 0;
    }
    if (!PyLong_CheckExact(v)) return -1;
    int overflow;
    *value = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow || (*value == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return -1;
    }
    if (none != NULL) *none = 0;
    return 0;
}

static int set_int(PyObject *obj, Py_ssize_t at, long long value) {
    PyObject *v = PyLong_FromLongLong(value);
    if (v == NULL) return -1;
    Py_XSETREF(SLOT(obj, at), v);
    return 0;
}

static int empty_list(PyObject *v) {
    return v != NULL && PyList_CheckExact(v) && PyList_GET_SIZE(v) == 0;
}

/* ``take(read, state, t)``: a read of whole events (as ``events`` reads them) that are all plain
 * tokens (a choice with no finish_reason; nothing of the answer kept; no usage past the stream's
 * limit, no deadline passed) taken into the StreamState at ``t`` at once, as its ``take`` would
 * take their Chunks: True. False, with the state untouched, where the read must go to the Python
 * side: any other event or read, a state whose stream is decided, read whole, keeps its answer or
 * has part of an event in its SSE parser. Every event is read and checked before anything is set. */
static PyObject *take(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "take(read, state, t)");
        return NULL;
    }
    PyObject *data = args[0], *st = args[1], *stamp = args[2];
    if (!PyBytes_CheckExact(data) || Py_TYPE(st) != stream_type || !PyLong_CheckExact(stamp)) Py_RETURN_FALSE;
    long long t = PyLong_AsLongLong(stamp);
    if (t == -1 && PyErr_Occurred()) return NULL;
    if (SLOT(st, stream_at[S_OUTCOME]) != Py_None || SLOT(st, stream_at[S_WHOLE]) != Py_None ||
        SLOT(st, stream_at[S_ANSWER]) != Py_None || SLOT(st, stream_at[S_FINAL]) != Py_False)
        Py_RETURN_FALSE;
    PyObject *parser = SLOT(st, stream_at[S_PARSER]);
    if (parser == NULL || Py_TYPE(parser) != parser_type) Py_RETURN_FALSE;
    PyObject *buf = SLOT(parser, parser_at[P_BUF]);
    if (buf == NULL || !PyBytes_CheckExact(buf) || PyBytes_GET_SIZE(buf) != 0 ||
        !empty_list(SLOT(parser, parser_at[P_PARTS])) || !empty_list(SLOT(parser, parser_at[P_DATA])))
        Py_RETURN_FALSE;
    PyObject *chunk_ns = SLOT(st, stream_at[S_CHUNK_NS]), *chunk_tokens = SLOT(st, stream_at[S_CHUNK_TOKENS]);
    if (chunk_ns == NULL || chunk_tokens == NULL || !PyList_CheckExact(chunk_ns) || !PyList_CheckExact(chunk_tokens))
        Py_RETURN_FALSE;
    long long streamed, cum, limit = 0, sent, first_limit = 0, total_limit = 0, first_answer;
    int limit_none, first_none, total_none, answer_none;
    if (int_slot(st, stream_at[S_STREAMED], &streamed, NULL) < 0 || int_slot(st, stream_at[S_CUM], &cum, NULL) < 0 ||
        int_slot(st, stream_at[S_SENT], &sent, NULL) < 0 ||
        int_slot(st, stream_at[S_LIMIT], &limit, &limit_none) < 0 ||
        int_slot(st, stream_at[S_FIRST_LIMIT], &first_limit, &first_none) < 0 ||
        int_slot(st, stream_at[S_TOTAL_LIMIT], &total_limit, &total_none) < 0 ||
        int_slot(st, stream_at[S_FIRST_ANSWER], &first_answer, &answer_none) < 0)
        Py_RETURN_FALSE;
    /* every event read and checked on copies of the counts */
    long long added[MAX_TAKE], cum0 = cum, prompt = 0, completion = 0, cached = 0;
    int count = 0, events_read = 0, prompt_set = 0, completion_set = 0, cached_set = 0;
    int have_chunks = PyList_GET_SIZE(chunk_ns) > 0;
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(data);
    const unsigned char *end = p + PyBytes_GET_SIZE(data), *event;
    size_t size;
    int found;
    while ((found = next_event(&p, end, &event, &size)) == 1) {
        Scan sc;
        events_read++;
        if (is_done(event, size) || scan_event(event + 6, (Py_ssize_t)size - 8, &sc) < 0) goto pass;
        if (!sc.has_choices || sc.finish.kind == 1) goto pass;
        Field *text = chosen_text(&sc);
        if (text->kind == 1 && (text->escaped || text->wide)) {
            PyObject *valid = string_value(text->s, text->len, text->escaped, text->wide);
            if (valid == NULL) goto pass;
            Py_DECREF(valid);
        }
        if (sc.prompt_set) {
            prompt = sc.prompt;
            prompt_set = 1;
        }
        if (sc.completion_set) {
            if (!limit_none && sc.completion > limit) goto pass; /* usage beyond max_tokens */
            completion = sc.completion;
            completion_set = 1;
        }
        if (sc.cached_set) {
            cached = sc.cached;
            cached_set = 1;
        }
        long long n;
        if (sc.completion_set && (cum > 0 || !have_chunks)) {
            n = sc.completion - cum; /* cumulative usage: what this chunk carried */
            if (n == 0 && text->kind == 1 && text->len > 0) {
                n = 1; /* usage a chunk behind the text it counts: the text is a token */
                cum += 1;
            } else {
                cum = sc.completion;
            }
        } else {
            n = (text->kind == 1 && text->len > 0) ? 1 : 0;
        }
        if (n > 0) {
            long long waited = t - sent;
            if ((!limit_none && streamed + n > limit) || (!have_chunks && !first_none && waited > first_limit) ||
                (!total_none && waited > total_limit) || count == MAX_TAKE)
                goto pass; /* an overrun or a deadline passed: said by the Python side */
            added[count++] = n;
            streamed += n;
            have_chunks = 1;
        }
    }
    if (found < 0 || events_read == 0) goto pass;
    /* then set */
    for (int i = 0; i < count; i++) {
        PyObject *n = PyLong_FromLongLong(added[i]);
        if (n == NULL) return NULL;
        int failed = PyList_Append(chunk_tokens, n) || PyList_Append(chunk_ns, stamp);
        Py_DECREF(n);
        if (failed) return NULL;
    }
    if ((count > 0 && set_int(st, stream_at[S_STREAMED], streamed) < 0) ||
        (cum != cum0 && set_int(st, stream_at[S_CUM], cum) < 0) ||
        (completion_set && set_int(st, stream_at[S_USAGE], completion) < 0) ||
        (prompt_set && set_int(st, stream_at[S_PROMPT], prompt) < 0) ||
        (cached_set && set_int(st, stream_at[S_CACHED], cached) < 0))
        return NULL;
    if (count > 0 && answer_none) Py_XSETREF(SLOT(st, stream_at[S_FIRST_ANSWER]), Py_NewRef(stamp));
    Py_RETURN_TRUE;
pass:
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_FALSE;
}

/* the offsets of a type's __slots__ members by name; -1 with an exception where one is not a slot */
static int slot_offsets(PyTypeObject *type, const char **names, int n, Py_ssize_t *out) {
    for (int i = 0; i < n; i++) {
        PyObject *d = PyObject_GetAttrString((PyObject *)type, names[i]);
        if (d == NULL) return -1;
        if (!Py_IS_TYPE(d, &PyMemberDescr_Type) || ((PyMemberDescrObject *)d)->d_member->type != T_OBJECT_EX) {
            PyErr_Format(PyExc_TypeError, "%s.%s is not a slot", type->tp_name, names[i]);
            Py_DECREF(d);
            return -1;
        }
        out[i] = ((PyMemberDescrObject *)d)->d_member->offset;
        Py_DECREF(d);
    }
    return 0;
}

static PyMethodDef take_def = {"take", (PyCFunction)(void (*)(void))take, METH_FASTCALL,
                               "take(read, state, t) -> bool: a read of plain tokens taken into the state."};

static PyObject *tokens(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *stream, *parser;
    if (!PyArg_ParseTuple(args, "O!O!", &PyType_Type, &stream, &PyType_Type, &parser)) return NULL;
    if (slot_offsets((PyTypeObject *)stream, stream_slots, S_COUNT, stream_at) < 0 ||
        slot_offsets((PyTypeObject *)parser, parser_slots, P_COUNT, parser_at) < 0)
        return NULL;
    Py_XSETREF(stream_type, (PyTypeObject *)Py_NewRef(stream));
    Py_XSETREF(parser_type, (PyTypeObject *)Py_NewRef(parser));
    return PyCFunction_New(&take_def, NULL);
}

static PyObject *parse_chunk(PyObject *Py_UNUSED(self), PyObject *data) {
    PyObject *chunk = scan_chunk(data);
    if (chunk != NULL || PyErr_Occurred()) return chunk;
    return PyObject_CallOneArg(fallback, data);
}

static PyObject *scan(PyObject *Py_UNUSED(self), PyObject *data) {
    if (chunk_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "configure() first");
        return NULL;
    }
    PyObject *chunk = scan_chunk(data);
    if (chunk != NULL || PyErr_Occurred()) return chunk;
    Py_RETURN_NONE;
}

#ifdef __linux__
/* ============================================================================================
 * 5. The kernel clock's reads (Linux)
 *
 * Contract: drain reads each ready socket of the epoll set once, with its SO_TIMESTAMPNS stamp,
 * and returns what each read gave; it owns no socket and closes none.
 */
/* as loadgen.load.stamped reads: at most this much a read, at most this many sockets a wake-up
 * (select.epoll's own bound) */
#define READ_BYTES (64 * 1024)
#define MAX_READY 1023
static unsigned char read_buffer[READ_BYTES];

/* ``drain(epfd, offset, transports)``: every ready socket of the epoll set ``epfd`` that
 * ``transports`` (fd -> transport) holds, read once with ``recvmsg`` and its SO_TIMESTAMPNS stamp,
 * as a list of (transport, bytes or an error number, the stamp on the monotonic clock in ns, or -1
 * where none came). ``offset``: the wall clock less the monotonic one, in ns. Empty bytes: the peer
 * closed. A socket with nothing to read (EAGAIN) is left out. The transports are looked up before
 * their reads, so a read always belongs to the socket its transport holds. */
static PyObject *drain(PyObject *Py_UNUSED(self), PyObject *args) {
    int epfd;
    long long offset;
    PyObject *transports;
    if (!PyArg_ParseTuple(args, "iLO!", &epfd, &offset, &PyDict_Type, &transports)) return NULL;
    struct epoll_event ready[MAX_READY];
    int n = epoll_wait(epfd, ready, MAX_READY, 0);
    if (n < 0) {
        if (errno != EINTR) return PyErr_SetFromErrno(PyExc_OSError);
        n = 0;
    }
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    union {
        char space[CMSG_SPACE(sizeof(struct timespec))];
        struct cmsghdr align;
    } control;
    for (int i = 0; i < n; i++) {
        int fd = ready[i].data.fd;
        PyObject *key = PyLong_FromLong(fd);
        if (key == NULL) goto failed;
        PyObject *transport = PyDict_GetItemWithError(transports, key);
        Py_DECREF(key);
        if (transport == NULL) {
            if (PyErr_Occurred()) goto failed;
            continue;
        }
        struct iovec iov = {read_buffer, READ_BYTES};
        struct msghdr msg = {0};
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.space;
        msg.msg_controllen = sizeof control.space;
        ssize_t got = recvmsg(fd, &msg, 0);
        long long arrived = -1;
        PyObject *data;
        if (got < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
            data = PyLong_FromLong(errno);
        } else {
            for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c != NULL; c = CMSG_NXTHDR(&msg, c)) {
                if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SO_TIMESTAMPNS &&
                    c->cmsg_len >= CMSG_LEN(sizeof(struct timespec))) {
                    struct timespec stamp;
                    memcpy(&stamp, CMSG_DATA(c), sizeof stamp);
                    arrived = (long long)stamp.tv_sec * 1000000000LL + stamp.tv_nsec - offset;
                    break;
                }
            }
            data = PyBytes_FromStringAndSize((const char *)read_buffer, got);
        }
        if (data == NULL) goto failed;
        PyObject *stamp = PyLong_FromLongLong(arrived);
        PyObject *item = PyTuple_New(3);
        if (stamp == NULL || item == NULL) {
            Py_DECREF(data);
            Py_XDECREF(stamp);
            Py_XDECREF(item);
            goto failed;
        }
        PyTuple_SET_ITEM(item, 0, Py_NewRef(transport));
        PyTuple_SET_ITEM(item, 1, data);
        PyTuple_SET_ITEM(item, 2, stamp);
        int appended = PyList_Append(out, item);
        Py_DECREF(item);
        if (appended) goto failed;
    }
    return out;
failed:
    Py_DECREF(out);
    return NULL;
}
#endif

static PyMethodDef parse_def = {"parse_chunk", parse_chunk, METH_O,
                                "A streamed chunk's Chunk (the compiled reading, else the Python one)."};

/* ============================================================================================
 * 6. The module
 *
 */
static PyObject *configure(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *type, *fn;
    if (!PyArg_ParseTuple(args, "O!O", &PyType_Type, &type, &fn)) return NULL;
    if (!PyType_IsSubtype((PyTypeObject *)type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "the chunk type must be a tuple type");
        return NULL;
    }
    Py_XSETREF(chunk_type, Py_NewRef(type));
    Py_XSETREF(fallback, Py_NewRef(fn));
    return PyCFunction_New(&parse_def, NULL);
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS,
     "configure(chunk_type, fallback) -> parse_chunk: the compiled reading, falling back to fallback(data)."},
    {"tokens", tokens, METH_VARARGS,
     "tokens(stream_type, parser_type) -> take(read, state, t): a read of plain tokens taken into a StreamState."},
    {"scan", scan, METH_O, "scan(data) -> Chunk or None: the compiled reading alone (None: it would fall back)."},
    {"events", events, METH_O,
     "events(read) -> list or None: a read of whole HTTP chunks of one whole event each, as its Chunks (None: "
     "[DONE]); None where the read is otherwise."},
#ifdef __linux__
    {"drain", drain, METH_VARARGS,
     "drain(epfd, offset, transports) -> list of (transport, bytes or errno, arrived ns or -1): every ready "
     "socket of the set read once with its receive stamp."},
#endif
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_chunkscan",
    .m_doc = "The common streamed chunk read in compiled code.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__chunkscan(void) {
    empty_tuple = PyTuple_New(0);
    empty_str = PyUnicode_New(0, 0);
    if (empty_tuple == NULL || empty_str == NULL) return NULL;
    return PyModule_Create(&module);
}
