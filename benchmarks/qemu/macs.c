/* qemu-aarch64 TCG plugin (API v1): guest instructions executed, and how many of them are
 * multiply-add instructions (vector and matrix: fmla, fmls, fmopa, sdot, udot, usdot, smmla,
 * ummla, bfmmla, bfdot, mla, mls, smlal, umlal, sqdmlal; scalar fmadd / madd not counted), so a
 * benchmark can show arithmetic apart from overhead. One line "insns macs" to outfile=<path> at exit.
 * As ../shared/tools/qemu-insn's plugins (Debian ships no qemu-plugin.h), it declares the few
 * API functions it uses itself. Exact for a single-threaded guest (plain counters). */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef uint64_t qemu_plugin_id_t;
struct qemu_plugin_tb;
struct qemu_plugin_insn;
typedef struct qemu_info_t qemu_info_t;
enum qemu_plugin_op { QEMU_PLUGIN_INLINE_ADD_U64 = 0 };
void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t, void (*)(qemu_plugin_id_t, struct qemu_plugin_tb *));
void qemu_plugin_register_vcpu_tb_exec_inline(struct qemu_plugin_tb *, enum qemu_plugin_op, void *, uint64_t);
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *);
struct qemu_plugin_insn *qemu_plugin_tb_get_insn(const struct qemu_plugin_tb *, size_t);
char *qemu_plugin_insn_disas(const struct qemu_plugin_insn *);
void qemu_plugin_register_atexit_cb(qemu_plugin_id_t, void (*)(qemu_plugin_id_t, void *), void *);

#define EXPORT __attribute__((visibility("default")))
EXPORT int qemu_plugin_version = 1;

static uint64_t insns, macs;
static char outfile[512] = "macs.txt";

static bool is_multiply_add(const char *disas) {
  static const char *const names[] = {"fmla", "fmls", "fmopa", "fmops", "sdot", "udot", "usdot", "sudot",
                                      "smmla", "ummla", "usmmla", "bfmmla", "bfdot", "bfmopa", "smopa",
                                      "umopa", "mla", "mls", "smlal", "smlal2", "umlal", "umlal2",
                                      "sqdmlal", "sqdmlal2", "smlsl", "smlsl2"};
  size_t n = strcspn(disas, " \t");
  for (size_t i = 0; i < sizeof names / sizeof *names; ++i)
    if (strlen(names[i]) == n && strncmp(disas, names[i], n) == 0) {
      /* vector and matrix forms only: a scalar register operand (s0, d0) is not one */
      const char *ops = disas + n;
      while (*ops == ' ' || *ops == '\t') ++ops;
      return *ops == 'v' || *ops == 'z' || *ops == 'p' || strncmp(names[i], "fmop", 4) == 0 ||
             strncmp(names[i], "smop", 4) == 0 || strncmp(names[i], "umop", 4) == 0 ||
             strncmp(names[i], "bfmop", 5) == 0;
    }
  return false;
}

static void on_tb_trans(qemu_plugin_id_t id, struct qemu_plugin_tb *tb) {
  (void)id;
  size_t n = qemu_plugin_tb_n_insns(tb), m = 0;
  for (size_t i = 0; i < n; ++i) {
    char *d = qemu_plugin_insn_disas(qemu_plugin_tb_get_insn(tb, i));
    if (d) {
      m += is_multiply_add(d);
      free(d);
    }
  }
  qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &insns, n);
  if (m) qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &macs, m);
}

static void on_exit_cb(qemu_plugin_id_t id, void *p) {
  (void)id; (void)p;
  FILE *f = fopen(outfile, "w");
  if (!f) return;
  fprintf(f, "%llu %llu\n", (unsigned long long)insns, (unsigned long long)macs);
  fclose(f);
}

EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc, char **argv) {
  (void)info;
  for (int i = 0; i < argc; ++i)
    if (strncmp(argv[i], "outfile=", 8) == 0) snprintf(outfile, sizeof outfile, "%s", argv[i] + 8);
  qemu_plugin_register_vcpu_tb_trans_cb(id, on_tb_trans);
  qemu_plugin_register_atexit_cb(id, on_exit_cb, NULL);
  return 0;
}
