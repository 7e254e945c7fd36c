// The FakeTcpStore as a process, for shell tests (tests/tools/doctor/doctor_cli.sh): prints its port, then serves
// until its standard input closes.
#include <cstdio>

#include "tests/runtime/comm/fake_tcp_store.h"

int main() {
  strata::comm::FakeTcpStore store;
  std::printf("%d\n", store.port());
  std::fflush(stdout);
  while (std::getchar() != EOF) {
  }
  return 0;
}
