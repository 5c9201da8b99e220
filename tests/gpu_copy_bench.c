/* The fusion copy kernel's bandwidth next to cudaMemcpy device-to-device,
 * on the same bytes: one tensor, and the ResNet-50-like case of many.
 * Prints one line per case and exits 1 where the kernel reaches less than
 * 70% of cudaMemcpy; 2 without a GPU. */
#include <stdio.h>

#include "comm/gpu/gpu.h"

int main(void) {
  if (!hora__gpu_present()) {
    printf("SKIP gpu/copy_bandwidth: no GPU visible\n");
    return 2;
  }
  struct {
    size_t bytes;
    int n;
  } cases[] = {{64u << 20, 1}, {(64u << 20) / 160, 160}, {256u << 10, 64}};
  int ok = 1;
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    double k = 0, m = 0;
    if (hora__gpu_copy_bandwidth(cases[i].bytes, cases[i].n, 20, &k, &m) != HORA_SUCCESS) {
      printf("FAIL gpu/copy_bandwidth: %s\n", hora_last_error());
      return 1;
    }
    double ratio = k / m;
    ok = ok && ratio >= 0.7;
    printf("%s gpu/copy_bandwidth %d x %zu bytes: batched kernel %.0f GB/s, cudaMemcpy D2D %.0f GB/s "
           "(%.0f%%, target >= 70%%)\n",
           ratio >= 0.7 ? "PASS" : "FAIL", cases[i].n, cases[i].bytes, k, m, 100 * ratio);
  }
  return ok ? 0 : 1;
}
