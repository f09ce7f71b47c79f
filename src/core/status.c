/* Status strings and the per-thread last error. */
#include <stdarg.h>
#include <stdio.h>

#include "core/internal.h"

static const char *const status_strings[] = {
#define TG__STATUS_STR(name, str) str,
    TG_STATUS_MAP(TG__STATUS_STR)
#undef TG__STATUS_STR
};

static TG_THREAD_LOCAL tg_status last_status = TG_OK;
static TG_THREAD_LOCAL char last_message[512];

const char *tg_strerror(tg_status status)
{
    if ((int)status < 0 || status >= TG_STATUS_COUNT_) return "unknown status";
    return status_strings[status];
}

tg_status tg_last_error(void)
{
    return last_status;
}

const char *tg_last_error_message(void)
{
    return last_message;
}

void tg_error_clear(void)
{
    last_status = TG_OK;
    last_message[0] = '\0';
}

static tg_status set_error(tg_status st, const char *fmt, va_list ap)
{
    last_status = st;
    vsnprintf(last_message, sizeof last_message, fmt, ap);
    return st;
}

tg_status tg__err(tg_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    set_error(st, fmt, ap);
    va_end(ap);
    return st;
}

tg_status tg_error_set(tg_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    set_error(status, fmt, ap);
    va_end(ap);
    return status;
}

tg_status tg__err_null(const char *op, int argi)
{
    if (last_status != TG_OK) return last_status;
    return tg__err(TG_ERR_NULL, "bad argument #%d to '%s' (NULL tensor)", argi, op);
}

const char *tg_version(void)
{
    return TAPEGRAD_VERSION;
}
