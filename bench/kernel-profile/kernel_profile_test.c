/*
 * The profiler's bookkeeping without CUPTI or a GPU: records fed by hand
 * land in the ranges their start times fall in, and the summary and the
 * TSV say what was fed. scripts/build-cuda.sh builds and runs it:
 *
 *     gcc -O1 -o kernel_profile_test kernel_profile_test.c -ldl -lpthread && ./kernel_profile_test
 */
#define KERNEL_PROFILE_NO_CUPTI
#include "kernel_profile.c"

#include <assert.h>

/* The summary (`summary` nonzero, at most `top` kernels a range) or the TSV, as a string. */
static void report(int summary, int top, char **out) {
  size_t len = 0;
  FILE *f = open_memstream(out, &len);
  profile_report(summary ? f : NULL, summary ? NULL : f, top, 0);
  fclose(f);
}

#define CHECK(cond)                                                                                \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "kernel_profile_test: %s:%d: %s\n", __FILE__, __LINE__, #cond);             \
      return 1;                                                                                    \
    }                                                                                              \
  } while (0)

int main(void) {
  /* Before any range: model loading. */
  add_copy(COPY_HTOD, 1000000, 10, 20);
  add_kernel("fill", 30, 40, 0);
  /* Range 1, wall 1000..2000 ns. */
  profile_start(1000);
  profile_start(1005); /* ignored: already open */
  add_kernel("gemm", 1100, 1400, 0);
  add_kernel("gemm", 1500, 1700, 0);
  add_kernel("_Z4axpyPfS_", 1700, 1750, 0);
  add_copy(MEMSET, 64, 1750, 1760);
  profile_stop(2000);
  profile_stop(2005); /* ignored: none open */
  /* Range 2, a captured graph's kernels. */
  profile_start(3000);
  add_kernel("gemm", 3100, 3200, 1);
  add_kernel("softmax", 3200, 3600, 1);
  profile_stop(4000);
  /* After: outside again. */
  add_kernel("fill", 5000, 5010, 0);

  CHECK(n_ranges == 3);
  CHECK(ranges[0].kernels == 2 && ranges[0].kernel_ns == 20);
  CHECK(ranges[0].copies[COPY_HTOD].count == 1 && ranges[0].copies[COPY_HTOD].bytes == 1000000);
  CHECK(ranges[1].kernels == 3 && ranges[1].kernel_ns == 550 && ranges[1].from_graph == 0);
  CHECK(ranges[1].copies[MEMSET].count == 1 && ranges[1].copies[MEMSET].ns == 10);
  CHECK(ranges[2].kernels == 2 && ranges[2].kernel_ns == 500 && ranges[2].from_graph == 2);

  char *txt = NULL;
  report(1, 1, &txt);
  /* Range 1: 1000 ns wall = 0.001 ms, 550 ns of kernels = 55%. */
  CHECK(strstr(txt, "== range 1: 0.001 ms wall, kernels 0.001 ms (55.0% of the wall) in 3 "
                    "launches") != NULL);
  CHECK(strstr(txt, "from graphs") != NULL);
  CHECK(strstr(txt, "== range 2: 0.001 ms wall, kernels 0.001 ms (50.0% of the wall) in 2 "
                    "launches") != NULL);
  /* top = 1: range 1 lists gemm (500 of 550 ns), not axpy. */
  CHECK(strstr(txt, "90.91        2      0.25  gemm") != NULL);
  CHECK(strstr(txt, "axpy") == NULL);
  free(txt);

  char *rows = NULL;
  report(0, 40, &rows);
  CHECK(strstr(rows, "range\tcount\ttotal_ns\tmax_ns\tkernel\n") == rows);
  CHECK(strstr(rows, "0\t2\t20\t10\tfill\n") != NULL);
  CHECK(strstr(rows, "1\t2\t500\t300\tgemm\n") != NULL);
  CHECK(strstr(rows, "2\t1\t400\t400\tsoftmax\n") != NULL);
  /* Range 1's rows by total time: gemm before axpy (demangled when the
   * demangler is in the process, as recorded otherwise). */
  char *gemm = strstr(rows, "1\t2\t500");
  char *axpy = strstr(rows, "1\t1\t50\t50\t");
  CHECK(gemm && axpy && gemm < axpy);
  free(rows);
  puts("kernel_profile_test: ok");
  return 0;
}
