/* Parameter files in the safetensors layout (see include/tapegrad/io.h).
 *
 * Both directions first build the same list of "items": every tensor the
 * file holds for (ps, opt), with its name, dtype, shape and the memory
 * behind it. Saving writes that list; loading parses and validates the
 * whole file against it (layout first, then names, dtypes and shapes) and
 * copies only when everything checks out, so a bad file changes nothing.
 * The JSON is built and parsed with jansson. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "train/train_internal.h"

#define HEADER_MAX (100u << 20) /* as the safetensors reference reader */
#define OPTIM_PREFIX "optim/"

typedef struct item {
    char *name;
    tg_dtype dtype;
    int ndim;
    int64_t shape[TG_MAX_DIMS];
    void *data; /* ours: where the values live (save) or go (load) */
    size_t nbytes;
} item;

typedef struct items {
    item *v;
    int n, cap;
} items;

static const char *const st_dtypes[TG_DTYPE_COUNT] = {"F32", "F64", "I64"};

static void items_free(items *it)
{
    for (int i = 0; i < it->n; i++)
        free(it->v[i].name);
    free(it->v);
}

/* Appends an item called prefix+name (prefix may be ""). */
static tg_status items_add(items *it, const char *prefix, const char *name, tg_dtype dtype,
                           int ndim, const int64_t *shape, void *data)
{
    if (it->n == it->cap) {
        int cap = it->cap ? it->cap * 2 : 32;
        item *v = realloc(it->v, (size_t)cap * sizeof *v);
        if (!v) return tg__err(TG_ERR_NOMEM, "out of memory listing a parameter file's tensors");
        it->v = v;
        it->cap = cap;
    }
    item *x = &it->v[it->n];
    size_t len = strlen(prefix) + strlen(name) + 1;
    x->name = malloc(len);
    if (!x->name) return tg__err(TG_ERR_NOMEM, "out of memory listing a parameter file's tensors");
    snprintf(x->name, len, "%s%s", prefix, name);
    x->dtype = dtype;
    x->ndim = ndim;
    for (int d = 0; d < ndim; d++)
        x->shape[d] = shape[d];
    x->data = data;
    x->nbytes = (size_t)tg__numel(ndim, shape) * tg_dtype_size(dtype);
    it->n++;
    return TG_OK;
}

/* Every tensor of the file for (ps, opt), in file order. */
static tg_status collect(const tg_params *ps, const tg_optim *opt, items *it)
{
    tg_status st = TG_OK;
    for (int i = 0; i < ps->n && !st; i++) {
        const tg__param *p = &ps->p[i];
        st = items_add(it, "", p->name, p->value->dtype, p->value->ndim, p->value->shape,
                       tg__tensor_ptr(p->value));
    }
    if (!opt || st) return st;
    char prefix[64];
    for (int s = 0; s < TG__ST_COUNT && !st; s++) {
        if (!opt->uses[s]) continue;
        snprintf(prefix, sizeof prefix, OPTIM_PREFIX "%s/", tg__optim_state_name(s));
        for (int i = 0; i < ps->n && !st; i++) {
            const tg__param *p = &ps->p[i];
            if (p->pool >= TG__POOL_TRAINABLE) continue;
            st = items_add(it, prefix, p->name, p->value->dtype, p->value->ndim, p->value->shape,
                           tg__param_slice(ps, i, opt->state[s][p->pool]));
        }
    }
    for (int i = 0; i < ps->n && !st; i++)
        if (ps->p[i].pool < TG__POOL_TRAINABLE)
            st =
                items_add(it, OPTIM_PREFIX "step/", ps->p[i].name, TG_I64, 0, NULL, &opt->steps[i]);
    if (!st) st = items_add(it, OPTIM_PREFIX, "steps", TG_I64, 0, NULL, (void *)&opt->step_count);
    return st;
}

/* Copies n bytes of elements of size es, converting between host order and
 * the file's little-endian order. */
static void copy_le(void *dst, const void *src, size_t n, size_t es)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    const unsigned char *s = src;
    unsigned char *d = dst;
    for (size_t i = 0; i < n; i += es)
        for (size_t b = 0; b < es; b++)
            d[i + b] = s[i + es - 1 - b];
#else
    (void)es;
    if (n) memcpy(dst, src, n);
#endif
}

/* jansson allocates through json_alloc, which notes a failure: its parser
 * reports running out of memory as a syntax error (a string buffer that
 * cannot grow reads as a bad token), and the flag tells the two apart.
 * Installed once, and only over jansson's defaults: a program that set its
 * own functions keeps them (its failures then read as a bad header). */
static TG_THREAD_LOCAL bool json_nomem;
static pthread_once_t json_once = PTHREAD_ONCE_INIT;

static void *json_alloc(size_t n)
{
    void *p = malloc(n);
    if (!p) json_nomem = true;
    return p;
}

static void json_setup(void)
{
    json_malloc_t m;
    json_free_t f;
    json_get_alloc_funcs(&m, &f);
    if (m == malloc && f == free) json_set_alloc_funcs(json_alloc, free);
}

static void json_begin(void)
{
    pthread_once(&json_once, json_setup);
    json_nomem = false;
}

static tg_status io_err(const char *what, const char *path)
{
    char msg[128];
    int e = errno;
    if (e == ENOMEM) return tg__err(TG_ERR_NOMEM, "out of memory: %s '%s'", what, path);
    if (strerror_r(e, msg, sizeof msg) != 0) snprintf(msg, sizeof msg, "errno %d", e);
    return tg__err(TG_ERR_IO, "%s '%s': %s", what, path, msg);
}

/* ---- Saving */

/* meta[key] = v as the shortest "%.Ng" that reads back exactly. */
static int set_num(json_t *meta, const char *key, double v)
{
    char buf[64];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) break;
    }
    return json_object_set_new(meta, key, json_string(buf));
}

static json_t *metadata(const tg_optim *opt)
{
    json_t *m = json_object();
    if (!m) return NULL;
    int bad = json_object_set_new(m, "tapegrad.version", json_string(TAPEGRAD_VERSION));
    if (opt) {
        const tg_optim_opts *o = &opt->o;
        bad |= json_object_set_new(m, "optim.kind", json_string(tg__optim_kind_name(o->kind)));
        bad |= set_num(m, "optim.lr", o->lr);
        bad |= set_num(m, "optim.weight_decay", o->weight_decay);
        bad |= set_num(m, "optim.momentum", o->momentum);
        bad |= set_num(m, "optim.dampening", o->dampening);
        bad |= set_num(m, "optim.nesterov", o->nesterov);
        bad |= set_num(m, "optim.beta1", o->beta1);
        bad |= set_num(m, "optim.beta2", o->beta2);
        bad |= set_num(m, "optim.eps", o->eps);
        bad |= set_num(m, "optim.amsgrad", o->amsgrad);
        bad |= set_num(m, "optim.alpha", o->alpha);
        bad |= set_num(m, "optim.centered", o->centered);
    }
    if (bad) {
        json_decref(m);
        return NULL;
    }
    return m;
}

/* Whether s is well-formed UTF-8 (no overlongs, surrogates or code points
 * past U+10FFFF), as jansson requires of keys: checked here so that a key
 * jansson cannot store for want of memory is not called malformed. */
static bool utf8_valid(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        unsigned c = *p++;
        int more = c < 0x80 ? 0 : c >= 0xc2 && c <= 0xdf ? 1 : (c & 0xf0) == 0xe0 ? 2
                   : c >= 0xf0 && c <= 0xf4 ? 3 : -1;
        if (more < 0) return false;
        unsigned cp = more == 0 ? c : more == 1 ? c & 0x1f : more == 2 ? c & 0x0f : c & 0x07;
        for (int k = 0; k < more; k++, p++) {
            if ((*p & 0xc0) != 0x80) return false;
            cp = (cp << 6) | (*p & 0x3f);
        }
        if ((more == 2 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
            (more == 3 && (cp < 0x10000 || cp > 0x10ffff)))
            return false;
    }
    return true;
}

/* The header text for it, padded with spaces so the data starts 8-byte
 * aligned. *len gets its length. NULL with the error set. */
static char *build_header(const items *it, const tg_optim *opt, size_t *len)
{
    for (int i = 0; i < it->n; i++)
        if (!utf8_valid(it->v[i].name))
            return tg__err(TG_ERR_INVALID, "bad argument #1 to 'params_save' (name '%s' is not "
                                           "valid UTF-8)", it->v[i].name), NULL;
    json_begin();
    json_t *root = json_object();
    if (!root) goto nomem;
    uint64_t off = 0;
    for (int i = 0; i < it->n; i++) {
        const item *x = &it->v[i];
        json_t *shape = json_array();
        for (int d = 0; shape && d < x->ndim; d++)
            if (json_array_append_new(shape, json_integer(x->shape[d]))) {
                json_decref(shape);
                shape = NULL;
            }
        json_t *e =
            shape ? json_pack("{s:s, s:o, s:[I,I]}", "dtype", st_dtypes[x->dtype], "shape", shape,
                              "data_offsets", (json_int_t)off, (json_int_t)(off + x->nbytes))
                  : NULL;
        if (!e || json_object_set_new(root, x->name, e)) goto nomem; /* names are valid */
        off += x->nbytes;
    }
    json_t *meta = metadata(opt);
    if (!meta || json_object_set_new(root, "__metadata__", meta)) goto nomem;
    char *text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    root = NULL;
    if (!text) goto nomem;
    size_t n = strlen(text), padded = (n + 7) & ~(size_t)7;
    char *h = realloc(text, padded + 1);
    if (!h) {
        free(text);
        goto nomem;
    }
    memset(h + n, ' ', padded - n);
    h[padded] = '\0';
    *len = padded;
    return h;
nomem:
    json_decref(root);
    tg__err(TG_ERR_NOMEM, "out of memory building a parameter file header");
    return NULL;
}

/* Directory part of path ("." if none) into buf. */
static void dir_of(const char *path, char *buf, size_t len)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(buf, len, ".");
    else if (slash == path)
        snprintf(buf, len, "/");
    else
        snprintf(buf, len, "%.*s", (int)(slash - path), path);
}

static tg_status write_file(FILE *f, const items *it, const char *header, size_t hlen)
{
    unsigned char n8[8];
    for (int b = 0; b < 8; b++)
        n8[b] = (unsigned char)((uint64_t)hlen >> (8 * b));
    if (fwrite(n8, 1, 8, f) != 8 || fwrite(header, 1, hlen, f) != hlen) return TG_ERR_IO;
    unsigned char buf[4096];
    for (int i = 0; i < it->n; i++) {
        const item *x = &it->v[i];
        size_t es = tg_dtype_size(x->dtype);
        for (size_t done = 0; done < x->nbytes;) {
            size_t chunk = x->nbytes - done < sizeof buf ? x->nbytes - done : sizeof buf;
            copy_le(buf, (const char *)x->data + done, chunk, es);
            if (fwrite(buf, 1, chunk, f) != chunk) return TG_ERR_IO;
            done += chunk;
        }
    }
    return TG_OK;
}

tg_status tg_params_save(const tg_params *ps, const tg_optim *opt, const char *path)
{
    if (!ps) return tg__err(TG_ERR_NULL, "bad argument #1 to 'params_save' (NULL parameter set)");
    if (!path) return tg__err(TG_ERR_NULL, "bad argument #3 to 'params_save' (NULL path)");
    if (opt && opt->ps != ps)
        return tg__err(TG_ERR_INVALID, "bad argument #2 to 'params_save' (optimizer is over "
                                       "another parameter set)");
    if (opt && tg__optim_fit((tg_optim *)opt)) return tg_last_error();
    items it = {0};
    tg_status st = collect(ps, opt, &it);
    size_t hlen = 0;
    char *header = st ? NULL : build_header(&it, opt, &hlen);
    if (!header) {
        items_free(&it);
        return st ? st : tg_last_error();
    }
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 12);
    char dir[4096];
    int fd = -1;
    FILE *f = NULL;
    if (!tmp) {
        st = tg__err(TG_ERR_NOMEM, "out of memory saving '%s'", path);
        goto done;
    }
    snprintf(tmp, plen + 12, "%s.tmp.XXXXXX", path);
    fd = mkstemp(tmp);
    if (fd < 0) {
        st = io_err("cannot create a temporary file for", path);
        free(tmp);
        tmp = NULL;
        goto done;
    }
    if (fchmod(fd, 0644) != 0 || !(f = fdopen(fd, "wb"))) {
        st = io_err("cannot open", tmp);
        goto done;
    }
    fd = -1; /* owned by f now */
    if (write_file(f, &it, header, hlen) || fflush(f) != 0 || fsync(fileno(f)) != 0) {
        st = io_err("cannot write", tmp);
        goto done;
    }
    int rc = fclose(f);
    f = NULL;
    if (rc != 0) {
        st = io_err("cannot write", tmp);
        goto done;
    }
    if (rename(tmp, path) != 0) {
        st = io_err("cannot rename the temporary file onto", path);
        goto done;
    }
    free(tmp);
    tmp = NULL;
    /* Make the rename itself durable. */
    dir_of(path, dir, sizeof dir);
    int dfd = open(dir, O_RDONLY | O_DIRECTORY);
    if (dfd < 0 || fsync(dfd) != 0) st = io_err("cannot sync the directory of", path);
    if (dfd >= 0) close(dfd);
done:
    if (f) fclose(f);
    if (fd >= 0) close(fd);
    if (tmp) {
        unlink(tmp);
        free(tmp);
    }
    free(header);
    items_free(&it);
    return st;
}

/* ---- Loading */

typedef struct fentry {
    const char *name; /* borrowed from the parsed JSON */
    tg_dtype dtype;
    int ndim;
    int64_t shape[TG_MAX_DIMS];
    uint64_t begin, end;
    bool used;
} fentry;

typedef struct file {
    unsigned char *buf;
    size_t size;
    const unsigned char *data; /* data section */
    uint64_t data_size;
    json_t *root;
    json_t *meta; /* borrowed; NULL if absent */
    fentry *e;
    int n;
} file;

static void file_free(file *f)
{
    free(f->buf);
    free(f->e);
    json_decref(f->root);
}

static tg_status read_all(const char *path, file *f)
{
    /* O_NONBLOCK: opening a FIFO must not wait for a writer; it and
     * devices (/dev/zero) are then refused as not regular files. */
    int fd = open(path, O_RDONLY | O_NONBLOCK);
    if (fd < 0) return io_err("cannot open", path);
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        tg_status st = io_err("cannot stat", path);
        close(fd);
        return st;
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return tg__err(TG_ERR_IO, "cannot read '%s': not a regular file (a %s)", path,
                       S_ISDIR(sb.st_mode)    ? "directory"
                       : S_ISFIFO(sb.st_mode) ? "FIFO"
                       : S_ISCHR(sb.st_mode)  ? "character device"
                       : S_ISBLK(sb.st_mode)  ? "block device"
                       : S_ISSOCK(sb.st_mode) ? "socket"
                                              : "special file");
    }
    f->size = (size_t)sb.st_size;
    f->buf = malloc(f->size ? f->size : 1);
    if (!f->buf) {
        close(fd);
        return tg__err(TG_ERR_NOMEM, "out of memory reading '%s' (%zu bytes)", path, f->size);
    }
    for (size_t got = 0; got < f->size;) {
        ssize_t r = read(fd, f->buf + got, f->size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            tg_status st = r < 0 ? io_err("cannot read", path)
                                 : tg__err(TG_ERR_IO, "'%s' shrank while being read", path);
            close(fd);
            return st;
        }
        got += (size_t)r;
    }
    close(fd);
    return TG_OK;
}

static tg_status hdr_err(const char *path, const char *name, const char *what)
{
    if (name) return tg__err(TG_ERR_HEADER, "'%s': tensor '%s': %s", path, name, what);
    return tg__err(TG_ERR_HEADER, "'%s': %s", path, what);
}

/* Parses one tensor entry of the header. */
static tg_status parse_entry(const char *path, const char *name, json_t *v, fentry *e)
{
    e->name = name;
    json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape");
    json_t *off = json_object_get(v, "data_offsets");
    if (!json_is_object(v)) return hdr_err(path, name, "entry is not a JSON object");
    if (!json_is_string(dt)) return hdr_err(path, name, "\"dtype\" missing or not a string");
    if (!json_is_array(sh)) return hdr_err(path, name, "\"shape\" missing or not an array");
    if (!json_is_array(off) || json_array_size(off) != 2 ||
        !json_is_integer(json_array_get(off, 0)) || !json_is_integer(json_array_get(off, 1)))
        return hdr_err(path, name, "\"data_offsets\" is not an array of two integers");
    int d = -1;
    for (int k = 0; k < TG_DTYPE_COUNT; k++)
        if (strcmp(json_string_value(dt), st_dtypes[k]) == 0) d = k;
    if (d < 0)
        return tg__err(TG_ERR_DTYPE,
                       "'%s': tensor '%s' has dtype \"%s\"; tapegrad reads F32, "
                       "F64 and I64",
                       path, name, json_string_value(dt));
    e->dtype = (tg_dtype)d;
    if (json_array_size(sh) > TG_MAX_DIMS) return hdr_err(path, name, "shape has more than 8 dims");
    e->ndim = (int)json_array_size(sh);
    uint64_t numel = 1;
    for (int k = 0; k < e->ndim; k++) {
        json_t *x = json_array_get(sh, (size_t)k);
        if (!json_is_integer(x) || json_integer_value(x) < 0)
            return hdr_err(path, name, "shape entries must be non-negative integers");
        e->shape[k] = (int64_t)json_integer_value(x);
        if (e->shape[k] && numel > (UINT64_MAX / 16) / (uint64_t)e->shape[k])
            return hdr_err(path, name, "shape is too large");
        numel *= (uint64_t)e->shape[k];
    }
    json_int_t b = json_integer_value(json_array_get(off, 0));
    json_int_t en = json_integer_value(json_array_get(off, 1));
    if (b < 0 || en < b)
        return tg__err(TG_ERR_OFFSETS, "'%s': tensor '%s' has data_offsets [%lld, %lld]", path,
                       name, (long long)b, (long long)en);
    e->begin = (uint64_t)b;
    e->end = (uint64_t)en;
    uint64_t need = numel * tg_dtype_size(e->dtype);
    if (e->end - e->begin != need)
        return tg__err(TG_ERR_OFFSETS,
                       "'%s': tensor '%s' spans %llu bytes of data; %s of its "
                       "shape needs %llu",
                       path, name, (unsigned long long)(e->end - e->begin), st_dtypes[e->dtype],
                       (unsigned long long)need);
    return TG_OK;
}

static int by_offset(const void *a, const void *b)
{
    const fentry *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(((const fentry *)a)->name, ((const fentry *)b)->name);
}

/* The data section must be covered exactly, without overlaps or gaps. A
 * layout that is consistent but runs past the end of the file is a
 * truncated file. Sorts f->e by offset. */
static tg_status check_layout(const char *path, file *f)
{
    qsort(f->e, (size_t)f->n, sizeof *f->e, by_offset);
    uint64_t at = 0;
    const char *prev = NULL;
    for (int i = 0; i < f->n; i++) {
        const fentry *e = &f->e[i];
        if (e->begin < at)
            return tg__err(TG_ERR_OFFSETS,
                           "'%s': tensors '%s' and '%s' overlap (bytes %llu..%llu "
                           "of the data)",
                           path, prev, e->name, (unsigned long long)e->begin,
                           (unsigned long long)at);
        if (e->begin > at) {
            if (e->end > f->data_size)
                return tg__err(TG_ERR_OFFSETS,
                               "'%s': tensor '%s' has data_offsets [%llu, %llu] "
                               "outside the data section of %llu bytes",
                               path, e->name, (unsigned long long)e->begin,
                               (unsigned long long)e->end, (unsigned long long)f->data_size);
            return tg__err(TG_ERR_OFFSETS,
                           "'%s': bytes %llu..%llu of the data (before tensor "
                           "'%s') belong to no tensor",
                           path, (unsigned long long)at, (unsigned long long)e->begin, e->name);
        }
        if (e->end > at) {
            at = e->end;
            prev = e->name;
        }
    }
    if (at > f->data_size)
        return tg__err(TG_ERR_TRUNCATED,
                       "'%s' is truncated: its tensors need %llu bytes of data, "
                       "the file has %llu (tensor '%s' is cut)",
                       path, (unsigned long long)at, (unsigned long long)f->data_size, prev);
    if (at < f->data_size)
        return tg__err(TG_ERR_OFFSETS, "'%s': the last %llu bytes of the data belong to no tensor",
                       path, (unsigned long long)(f->data_size - at));
    return TG_OK;
}

/* Reads, parses and checks the file's own consistency. */
static tg_status parse_file(const char *path, file *f)
{
    tg_status st = read_all(path, f);
    if (st) return st;
    if (f->size < 8)
        return tg__err(TG_ERR_TRUNCATED,
                       "'%s' is truncated: %zu bytes, shorter than the 8-byte "
                       "header length",
                       path, f->size);
    uint64_t hlen = 0;
    for (int b = 0; b < 8; b++)
        hlen |= (uint64_t)f->buf[b] << (8 * b);
    if (hlen > f->size - 8)
        return tg__err(TG_ERR_HEADER,
                       "'%s': header length %llu is larger than the %zu bytes "
                       "after it",
                       path, (unsigned long long)hlen, f->size - 8);
    if (hlen < 2 || hlen > HEADER_MAX)
        return tg__err(TG_ERR_HEADER, "'%s': header length %llu outside 2..%u", path,
                       (unsigned long long)hlen, HEADER_MAX);
    json_error_t jerr;
    json_begin();
    f->root = json_loadb((const char *)f->buf + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!f->root && (json_nomem || json_error_code(&jerr) == json_error_out_of_memory))
        return tg__err(TG_ERR_NOMEM, "out of memory parsing the header of '%s'", path);
    if (!f->root)
        return tg__err(TG_ERR_HEADER, "'%s': header is not valid JSON (%s, at byte %d)", path,
                       jerr.text, jerr.position);
    if (!json_is_object(f->root)) return hdr_err(path, NULL, "header is not a JSON object");
    f->data = f->buf + 8 + hlen;
    f->data_size = f->size - 8 - hlen;
    f->e = calloc(json_object_size(f->root) + 1, sizeof *f->e);
    if (!f->e) return tg__err(TG_ERR_NOMEM, "out of memory reading '%s'", path);
    const char *key;
    json_t *v;
    json_object_foreach(f->root, key, v)
    {
        if (strcmp(key, "__metadata__") == 0) {
            const char *mk;
            json_t *mv;
            if (!json_is_object(v)) return hdr_err(path, NULL, "__metadata__ is not an object");
            json_object_foreach(v, mk, mv) if (!json_is_string(mv)) return tg__err(
                TG_ERR_HEADER, "'%s': __metadata__ value of \"%s\" is not a string", path, mk);
            f->meta = v;
            continue;
        }
        st = parse_entry(path, key, v, &f->e[f->n]);
        if (st) return st;
        f->n++;
    }
    st = check_layout(path, f);
    if (st) return st;
    qsort(f->e, (size_t)f->n, sizeof *f->e, by_name);
    return TG_OK;
}

static fentry *lookup(file *f, const char *name)
{
    fentry key = {.name = name};
    return bsearch(&key, f->e, (size_t)f->n, sizeof *f->e, by_name);
}

/* Checks the file's optimizer metadata against opt; *lr gets its lr. */
static tg_status check_optim_meta(const char *path, file *f, const tg_optim *opt, double *lr)
{
    json_t *kind = f->meta ? json_object_get(f->meta, "optim.kind") : NULL;
    json_t *jlr = f->meta ? json_object_get(f->meta, "optim.lr") : NULL;
    if (!kind)
        return tg__err(TG_ERR_NOT_FOUND,
                       "'%s' holds no optimizer state (no \"optim.kind\" in "
                       "__metadata__)",
                       path);
    const char *want = tg__optim_kind_name(opt->o.kind);
    if (strcmp(json_string_value(kind), want) != 0)
        return tg__err(TG_ERR_INVALID,
                       "bad argument #2 to 'params_load' ('%s' holds %s state, "
                       "the optimizer is %s)",
                       path, json_string_value(kind), want);
    char *end = NULL;
    const char *s = jlr ? json_string_value(jlr) : "";
    *lr = strtod(s, &end);
    /* The rule of tg_optim_set_lr: finite and >= 0. */
    if (!jlr || end == s || *end != '\0' || !(*lr >= 0.0) || !isfinite(*lr))
        return tg__err(TG_ERR_HEADER,
                       "'%s': __metadata__ \"optim.lr\" is missing or not a "
                       "finite number >= 0 (\"%.40s\")",
                       path, s);
    return TG_OK;
}

/* Step counts the optimizer can take on from: a negative one made the bias
 * corrections NaN, INT64_MAX overflowed on the next step. */
static tg_status check_step_count(const char *path, const fentry *e, const unsigned char *p)
{
    int64_t v;
    copy_le(&v, p, sizeof v, sizeof v);
    if (v < 0 || v > TG_OPTIM_MAX_STEPS)
        return tg__err(TG_ERR_HEADER, "'%s': tensor '%s' holds step count %lld, outside "
                                      "[0, 2^53]", path, e->name, (long long)v);
    return TG_OK;
}

static tg_status check_item(const char *path, file *f, const item *x)
{
    fentry *e = lookup(f, x->name);
    if (!e) return tg__err(TG_ERR_NOT_FOUND, "'%s' has no tensor '%s'", path, x->name);
    e->used = true;
    if (e->dtype != x->dtype)
        return tg__err(TG_ERR_DTYPE, "'%s': tensor '%s' is %s, the parameter is %s", path, x->name,
                       st_dtypes[e->dtype], st_dtypes[x->dtype]);
    if (!tg__same_shape(e->ndim, e->shape, x->ndim, x->shape)) {
        char a[96], b[96];
        return tg__err(TG_ERR_SHAPE, "'%s': tensor '%s' has shape %s, the parameter %s", path,
                       x->name, tg_shape_str(e->ndim, e->shape, a, sizeof a),
                       tg_shape_str(x->ndim, x->shape, b, sizeof b));
    }
    if (strncmp(x->name, OPTIM_PREFIX "step", strlen(OPTIM_PREFIX "step")) == 0)
        return check_step_count(path, e, f->data + e->begin);
    return TG_OK;
}

tg_status tg_params_load(tg_params *ps, tg_optim *opt, const char *path)
{
    if (!ps) return tg__err(TG_ERR_NULL, "bad argument #1 to 'params_load' (NULL parameter set)");
    if (!path) return tg__err(TG_ERR_NULL, "bad argument #3 to 'params_load' (NULL path)");
    if (opt && opt->ps != ps)
        return tg__err(TG_ERR_INVALID, "bad argument #2 to 'params_load' (optimizer is over "
                                       "another parameter set)");
    if (opt && tg__optim_fit(opt)) return tg_last_error();
    file f = {0};
    items it = {0};
    double lr = 0.0;
    tg_status st = parse_file(path, &f);
    if (!st) st = collect(ps, opt, &it);
    if (!st && opt) st = check_optim_meta(path, &f, opt, &lr);
    for (int i = 0; i < it.n && !st; i++)
        st = check_item(path, &f, &it.v[i]);
    for (int i = 0; i < f.n && !st; i++) {
        const fentry *e = &f.e[i];
        if (e->used || (!opt && strncmp(e->name, OPTIM_PREFIX, strlen(OPTIM_PREFIX)) == 0))
            continue;
        st = tg__err(TG_ERR_EXTRA, "'%s' has a tensor '%s' that is no %s", path, e->name,
                     opt ? "parameter, buffer or optimizer state" : "parameter or buffer");
    }
    if (!st) {
        /* Everything checked out: copy. */
        for (int i = 0; i < it.n; i++) {
            const fentry *e = lookup(&f, it.v[i].name);
            copy_le(it.v[i].data, f.data + e->begin, it.v[i].nbytes, tg_dtype_size(it.v[i].dtype));
        }
        if (opt) opt->o.lr = lr;
        for (int i = 0; i < ps->n; i++) tg__tensor_written(ps->p[i].value);
    }
    items_free(&it);
    file_free(&f);
    return st;
}
