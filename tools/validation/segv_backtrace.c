/* A native backtrace on SIGSEGV/SIGBUS, for a crash inside a library on a machine without a
 * debugger (the GPU machine has no gdb):
 *
 *   gcc -shared -fPIC -O1 -o /tmp/segv_backtrace.so tools/validation/segv_backtrace.c
 *   LD_PRELOAD=/tmp/segv_backtrace.so python3 ...
 *
 * Prints the faulting address and the return addresses with their exported symbols (as
 * backtrace_symbols_fd gives them) on stderr, then lets the signal kill the process as before.
 */
#define _GNU_SOURCE
#include <execinfo.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

static void write_text(const char *text) { (void)!write(2, text, strlen(text)); }

static void write_hex(uintptr_t value) {
  char digits[2 + 2 * sizeof value + 1];
  int at = sizeof digits - 1;
  digits[at] = '\0';
  do {
    digits[--at] = "0123456789abcdef"[value & 15];
    value >>= 4;
  } while (value && at > 2);
  digits[--at] = 'x';
  digits[--at] = '0';
  write_text(digits + at);
}

static void on_fault(int sig, siginfo_t *info, void *context) {
  (void)context;
  void *frames[64];
  int count = backtrace(frames, 64);
  write_text("\n--- native backtrace (segv_backtrace.so), signal ");
  write_text(sig == SIGSEGV ? "SIGSEGV" : "SIGBUS");
  write_text(" at address ");
  write_hex((uintptr_t)info->si_addr);
  write_text(" ---\n");
  backtrace_symbols_fd(frames, count, 2);
  signal(sig, SIG_DFL);
  raise(sig);
}

__attribute__((constructor)) static void install(void) {
  struct sigaction action;
  memset(&action, 0, sizeof action);
  action.sa_sigaction = on_fault;
  action.sa_flags = SA_SIGINFO | SA_RESETHAND;
  sigaction(SIGSEGV, &action, NULL);
  sigaction(SIGBUS, &action, NULL);
}
