/*
 * Per-kernel GPU time of any CUDA program, without Nsight Systems: a CUPTI
 * injection library. The CUDA driver loads it at cuInit when
 *
 *     CUDA_INJECTION64_PATH=/path/to/libkernel_profile.so program ...
 *
 * and it records every kernel, memcpy and memset the GPU runs (CUPTI's
 * activity API: device timestamps, kernels not serialised). The program
 * marks what to measure with cuProfilerStart/cuProfilerStop (cudarc's
 * profiler_start/stop, torch.cuda.profiler.start/stop); each start..stop is
 * one numbered range, and a record belongs to the range its start falls in
 * (range 0: outside every range). At exit it writes, per range, the wall
 * time, the GPU time and launches in it, and the kernels by total time:
 *
 *     $KERNEL_PROFILE_OUT/profile-PID.txt   the summary (default: stderr)
 *     $KERNEL_PROFILE_OUT/profile-PID.tsv   every (range, kernel) row
 *
 * KERNEL_PROFILE_TOP (default 40) caps the kernels listed per range in the
 * summary. Built by scripts/build-cuda.sh against the CUPTI of its toolkit;
 * with KERNEL_PROFILE_NO_CUPTI only the bookkeeping is compiled, for
 * kernel_profile_test.c.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------ bookkeeping */

#define MAX_RANGES 1024
#define TABLE_SLOTS (1u << 16)

enum copy_kind { COPY_HTOD, COPY_DTOH, COPY_DTOD, COPY_OTHER, MEMSET, N_COPY };
static const char *const COPY_NAMES[N_COPY] = {"memcpy HtoD", "memcpy DtoH", "memcpy DtoD",
                                               "memcpy other", "memset"};

struct copy_total {
  uint64_t count, bytes, ns;
};

struct range {
  uint64_t start, end; /* end 0 while open */
  uint64_t kernels, kernel_ns, from_graph;
  uint64_t first, last; /* device time span of its records */
  struct copy_total copies[N_COPY];
};

/* One (range, kernel name) row. */
struct entry {
  char *name; /* NULL: free slot */
  uint32_t range;
  uint64_t count, total_ns, max_ns;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct range ranges[MAX_RANGES]; /* ranges[0]: outside every range */
static uint32_t n_ranges = 1;
static int range_open = 0;
static struct entry *table;
static uint64_t rows_dropped = 0;

static uint64_t name_hash(const char *s, uint32_t range) {
  uint64_t h = 1469598103934665603ull ^ range;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

/* The range a record that started at `ts` belongs to (lock held). */
static uint32_t range_of(uint64_t ts) {
  for (uint32_t r = n_ranges - 1; r >= 1; r--) {
    if (ts >= ranges[r].start && (ranges[r].end == 0 || ts < ranges[r].end)) return r;
  }
  return 0;
}

static void span(struct range *r, uint64_t start, uint64_t end) {
  if (r->first == 0 || start < r->first) r->first = start;
  if (end > r->last) r->last = end;
}

/* Opens a range at `ts`; a start inside an open range is ignored. */
static void profile_start(uint64_t ts) {
  pthread_mutex_lock(&lock);
  if (!range_open && n_ranges < MAX_RANGES) {
    memset(&ranges[n_ranges], 0, sizeof ranges[n_ranges]);
    ranges[n_ranges].start = ts;
    n_ranges++;
    range_open = 1;
  }
  pthread_mutex_unlock(&lock);
}

/* Closes the open range at `ts`; a stop with none open is ignored. */
static void profile_stop(uint64_t ts) {
  pthread_mutex_lock(&lock);
  if (range_open) {
    ranges[n_ranges - 1].end = ts;
    range_open = 0;
  }
  pthread_mutex_unlock(&lock);
}

static void add_kernel(const char *name, uint64_t start, uint64_t end, int in_graph) {
  if (!name) name = "(unnamed)";
  uint64_t ns = end > start ? end - start : 0;
  pthread_mutex_lock(&lock);
  if (!table) table = calloc(TABLE_SLOTS, sizeof *table);
  uint32_t r = range_of(start);
  struct range *rg = &ranges[r];
  rg->kernels++;
  rg->kernel_ns += ns;
  rg->from_graph += in_graph ? 1 : 0;
  span(rg, start, end);
  uint64_t h = name_hash(name, r);
  struct entry *e = NULL;
  for (uint32_t probe = 0; table && probe < TABLE_SLOTS; probe++) {
    struct entry *c = &table[(h + probe) & (TABLE_SLOTS - 1)];
    if (!c->name) {
      c->name = strdup(name);
      c->range = r;
      e = c;
      break;
    }
    if (c->range == r && strcmp(c->name, name) == 0) {
      e = c;
      break;
    }
  }
  if (e && e->name) {
    e->count++;
    e->total_ns += ns;
    if (ns > e->max_ns) e->max_ns = ns;
  } else {
    rows_dropped++;
  }
  pthread_mutex_unlock(&lock);
}

static void add_copy(enum copy_kind kind, uint64_t bytes, uint64_t start, uint64_t end) {
  pthread_mutex_lock(&lock);
  struct range *rg = &ranges[range_of(start)];
  struct copy_total *c = &rg->copies[kind];
  c->count++;
  c->bytes += bytes;
  c->ns += end > start ? end - start : 0;
  span(rg, start, end);
  pthread_mutex_unlock(&lock);
}

/* A readable kernel name: C++ names demangled when the process has
 * libstdc++'s demangler (looked up, not linked), else as recorded. */
static char *readable(const char *name) {
  typedef char *(*demangle_fn)(const char *, char *, size_t *, int *);
  static demangle_fn demangle;
  static int looked;
  if (!looked) {
    demangle = (demangle_fn)dlsym(RTLD_DEFAULT, "__cxa_demangle");
    looked = 1;
  }
  if (demangle && strncmp(name, "_Z", 2) == 0) {
    int status = -1;
    char *d = demangle(name, NULL, NULL, &status);
    if (status == 0 && d) return d;
    free(d);
  }
  return strdup(name);
}

static int by_range_then_time(const void *a, const void *b) {
  const struct entry *x = a, *y = b;
  if (x->range != y->range) return x->range < y->range ? -1 : 1;
  if (x->total_ns != y->total_ns) return x->total_ns > y->total_ns ? -1 : 1;
  return strcmp(x->name, y->name);
}

/* Writes the summary to `txt` and every row to `tsv` (either may be NULL). */
static void profile_report(FILE *txt, FILE *tsv, int top, uint64_t records_dropped) {
  pthread_mutex_lock(&lock);
  size_t n = 0;
  struct entry *rows = calloc(TABLE_SLOTS, sizeof *rows);
  for (uint32_t i = 0; table && rows && i < TABLE_SLOTS; i++) {
    if (table[i].name) rows[n++] = table[i];
  }
  if (rows) qsort(rows, n, sizeof *rows, by_range_then_time);
  if (tsv) fprintf(tsv, "range\tcount\ttotal_ns\tmax_ns\tkernel\n");
  size_t row = 0;
  for (uint32_t r = 0; r < n_ranges; r++) {
    struct range *rg = &ranges[r];
    int any_copy = 0;
    for (int k = 0; k < N_COPY; k++) any_copy |= rg->copies[k].count > 0;
    if (rg->kernels == 0 && !any_copy && r == 0) continue;
    if (txt) {
      double wall_ms = rg->end > rg->start ? (rg->end - rg->start) / 1e6 : 0.0;
      double busy_ms = rg->kernel_ns / 1e6;
      if (r == 0) {
        fprintf(txt, "== outside every range: %.3f ms in %" PRIu64 " kernels\n", busy_ms,
                rg->kernels);
      } else {
        fprintf(txt,
                "== range %u: %.3f ms wall, kernels %.3f ms (%.1f%% of the wall) in %" PRIu64
                " launches (%.1f a ms, %" PRIu64 " from graphs)\n",
                r, wall_ms, busy_ms, wall_ms > 0 ? 100.0 * busy_ms / wall_ms : 0.0, rg->kernels,
                wall_ms > 0 ? rg->kernels / wall_ms : 0.0, rg->from_graph);
      }
      for (int k = 0; k < N_COPY; k++) {
        struct copy_total *c = &rg->copies[k];
        if (c->count)
          fprintf(txt, "   %-12s %8" PRIu64 " x %10.3f MB %10.3f ms\n", COPY_NAMES[k], c->count,
                  c->bytes / 1e6, c->ns / 1e6);
      }
      fprintf(txt, "   %9s %6s %8s %9s  %s\n", "ms", "%", "count", "mean_us", "kernel");
    }
    int shown = 0;
    for (; row < n && rows[row].range == r; row++) {
      struct entry *e = &rows[row];
      char *name = readable(e->name);
      if (tsv) {
        fprintf(tsv, "%u\t%" PRIu64 "\t%" PRIu64 "\t%" PRIu64 "\t%s\n", r, e->count, e->total_ns,
                e->max_ns, name ? name : e->name);
      }
      if (txt && shown < top) {
        const char *s = name ? name : e->name;
        fprintf(txt, "   %9.3f %6.2f %8" PRIu64 " %9.2f  %.150s\n", e->total_ns / 1e6,
                rg->kernel_ns ? 100.0 * e->total_ns / rg->kernel_ns : 0.0, e->count,
                e->total_ns / 1e3 / e->count, s);
        shown++;
      }
      free(name);
    }
  }
  if (txt && (rows_dropped || records_dropped))
    fprintf(txt, "!! %" PRIu64 " kernel rows and %" PRIu64 " CUPTI records were dropped\n",
            rows_dropped, records_dropped);
  free(rows);
  pthread_mutex_unlock(&lock);
}

/* ------------------------------------------------------------------ CUPTI */

#ifndef KERNEL_PROFILE_NO_CUPTI
#include <cupti.h>

#define BUFFER_BYTES (8u << 20)

/* Opens $KERNEL_PROFILE_OUT/profile-PID.EXT for writing, or NULL. */
static FILE *report_file(const char *ext) {
  const char *dir = getenv("KERNEL_PROFILE_OUT");
  if (!dir || !*dir) return NULL;
  char path[4096];
  snprintf(path, sizeof path, "%s/profile-%d.%s", dir, (int)getpid(), ext);
  FILE *f = fopen(path, "w");
  if (!f) fprintf(stderr, "kernel_profile: cannot write %s\n", path);
  return f;
}

static int report_top(void) {
  const char *s = getenv("KERNEL_PROFILE_TOP");
  int top = s ? atoi(s) : 40;
  return top > 0 ? top : 40;
}

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
  *buffer = aligned_alloc(8, BUFFER_BYTES);
  *size = *buffer ? BUFFER_BYTES : 0;
  *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer,
                                      size_t size, size_t valid) {
  (void)ctx;
  (void)stream;
  (void)size;
  CUpti_Activity *record = NULL;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    switch (record->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
      CUpti_ActivityKernel10 *k = (CUpti_ActivityKernel10 *)record;
      add_kernel(k->name, k->start, k->end, k->graphId != 0);
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      CUpti_ActivityMemcpy6 *m = (CUpti_ActivityMemcpy6 *)record;
      enum copy_kind kind = m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_HTOD   ? COPY_HTOD
                            : m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_DTOH ? COPY_DTOH
                            : m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_DTOD ? COPY_DTOD
                                                                             : COPY_OTHER;
      add_copy(kind, m->bytes, m->start, m->end);
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
      CUpti_ActivityMemset4 *m = (CUpti_ActivityMemset4 *)record;
      add_copy(MEMSET, m->bytes, m->start, m->end);
      break;
    }
    default:
      break;
    }
  }
  free(buffer);
}

/* cuProfilerStart/Stop, from the driver API or the runtime's wrappers. */
static void CUPTIAPI on_api(void *userdata, CUpti_CallbackDomain domain, CUpti_CallbackId id,
                            const void *data) {
  (void)userdata;
  const CUpti_CallbackData *call = data;
  int start = (domain == CUPTI_CB_DOMAIN_DRIVER_API && id == CUPTI_DRIVER_TRACE_CBID_cuProfilerStart) ||
              (domain == CUPTI_CB_DOMAIN_RUNTIME_API &&
               id == CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStart_v4000);
  uint64_t ts = 0;
  cuptiGetTimestamp(&ts);
  /* A range runs from the start call's return to the stop call's entry. */
  if (start && call->callbackSite == CUPTI_API_EXIT) profile_start(ts);
  if (!start && call->callbackSite == CUPTI_API_ENTER) profile_stop(ts);
}

static void warn_on(CUptiResult r, const char *what) {
  if (r != CUPTI_SUCCESS) {
    const char *s = NULL;
    cuptiGetResultString(r, &s);
    fprintf(stderr, "kernel_profile: %s: %s\n", what, s ? s : "?");
  }
}

/* "# PROGRAM ARGS (pid N)": which process a report is of. */
static void program_line(FILE *f) {
  char cmd[512] = {0};
  FILE *c = fopen("/proc/self/cmdline", "r");
  size_t n = c ? fread(cmd, 1, sizeof cmd - 1, c) : 0;
  if (c) fclose(c);
  for (size_t i = 0; i + 1 < n; i++)
    if (cmd[i] == 0) cmd[i] = ' ';
  fprintf(f, "# %s (pid %d)\n", n ? cmd : "?", (int)getpid());
}

static void at_exit(void) {
  warn_on(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "flushing");
  size_t dropped = 0;
  cuptiActivityGetNumDroppedRecords(NULL, 0, &dropped);
  FILE *txt = report_file("txt");
  FILE *tsv = report_file("tsv");
  program_line(txt ? txt : stderr);
  profile_report(txt ? txt : stderr, tsv, report_top(), dropped);
  if (txt) fclose(txt);
  if (tsv) fclose(tsv);
}

/* The driver's entry point for injection libraries; nonzero on success. */
int InitializeInjection(void) {
  static CUpti_SubscriberHandle subscriber;
  warn_on(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "activity buffers");
  warn_on(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "kernel records");
  warn_on(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY), "memcpy records");
  warn_on(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET), "memset records");
  CUptiResult r = cuptiSubscribe(&subscriber, on_api, NULL);
  warn_on(r, "subscribing to cuProfilerStart/Stop (no ranges: everything is range 0)");
  static const struct {
    CUpti_CallbackDomain domain;
    CUpti_CallbackId id;
    const char *what;
  } marks[] = {
      {CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuProfilerStart, "cuProfilerStart callback"},
      {CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuProfilerStop, "cuProfilerStop callback"},
      {CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStart_v4000,
       "cudaProfilerStart callback"},
      {CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStop_v4000,
       "cudaProfilerStop callback"},
  };
  for (size_t i = 0; r == CUPTI_SUCCESS && i < sizeof marks / sizeof marks[0]; i++)
    warn_on(cuptiEnableCallback(1, subscriber, marks[i].domain, marks[i].id), marks[i].what);
  atexit(at_exit);
  return 1;
}
#endif
