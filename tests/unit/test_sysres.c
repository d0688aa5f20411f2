/* test_sysres: the cores and memory a process may use, read from fake
 * /proc and /sys trees (common/base/sysres.h). cgroup v2 cpu.max
 * "100000 100000" is 1 core, "max 100000" none, "150000 100000" 2 (rounded
 * up); nested cgroups give the smallest of the path, wherever it sits; an
 * affinity mask smaller than the quota wins; memory.max "max" is no limit
 * and a limit above the physical size is not the figure; cgroup v1's
 * cpu.cfs_quota_us / cpu.cfs_period_us and memory.limit_in_bytes on a
 * hybrid host (v1 controllers beside an empty v2 mount); a container that
 * sees only its own cgroup at the mount's top; mountinfo's escaped mount
 * points; malformed and unreadable files ignored and named in note; an
 * over-long line skipped. And the host id: given, validated, a long one
 * hashed; machine-id; the hostname without one. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "errors.h"
#include "sysres.h"

#define GIB ((int64_t)1 << 30)

static char root[256];

/* mkdir -p of ROOT/path's folder, then the file with text. */
static void put(const char *path, const char *text) {
  char p[PATH_MAX];
  snprintf(p, sizeof p, "%s%s", root, path);
  for (char *s = p + strlen(root) + 1; (s = strchr(s, '/')); s++) {
    *s = '\0';
    mkdir(p, 0755);
    *s = '/';
  }
  FILE *f = fopen(p, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

static int setup(void **state) {
  (void)state;
  snprintf(root, sizeof root, "/tmp/pw-sysres.XXXXXX");
  assert_non_null(mkdtemp(root));
  return 0;
}

static int teardown(void **state) {
  (void)state;
  char cmd[PATH_MAX + 16];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
  assert_int_equal(system(cmd), 0);
  return 0;
}

/* A v2-only host: the process in /kubepods/pod1/c1, cgroup2 at /sys/fs/cgroup. */
static const char *MOUNTS_V2 =
    "22 1 0:21 / /proc rw,nosuid - proc proc rw\n"
    "30 22 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n";

static pw_sysres readit(int cpus, int64_t phys) {
  pw_sysres_src src = {.root = root, .cpus = cpus, .online = 8, .phys = phys};
  pw_sysres r;
  assert_int_equal(pw_sysres_read(&src, &r), 0);
  return r;
}

static void v2_tree(const char *leaf_cpu, const char *leaf_mem) {
  put("/proc/self/cgroup", "0::/kubepods/pod1/c1\n");
  put("/proc/self/mountinfo", MOUNTS_V2);
  if (leaf_cpu) put("/sys/fs/cgroup/kubepods/pod1/c1/cpu.max", leaf_cpu);
  if (leaf_mem) put("/sys/fs/cgroup/kubepods/pod1/c1/memory.max", leaf_mem);
}

static void test_v2_quota(void **state) {
  (void)state;
  v2_tree("100000 100000\n", "max\n");
  pw_sysres r = readit(4, 16 * GIB);
  assert_int_equal(r.cores, 1);
  assert_int_equal(r.quota_cores, 1);
  assert_string_equal(r.cores_from, "/sys/fs/cgroup/kubepods/pod1/c1/cpu.max: 100000/100000 = 1 CPU");
  assert_true(r.memory == 16 * GIB);
  assert_true(r.mem_limit == 0); /* "max" */
  assert_string_equal(r.memory_from, "physical memory: 16.0 GiB");
  assert_string_equal(r.note, "");

  v2_tree("max 100000\n", NULL);
  r = readit(4, 16 * GIB);
  assert_int_equal(r.cores, 4);
  assert_int_equal(r.quota_cores, 0);
  assert_string_equal(r.cores_from, "the affinity mask: 4 of 8 CPUs online");

  v2_tree("150000 100000\n", NULL);
  r = readit(4, 16 * GIB);
  assert_int_equal(r.cores, 2);
  assert_string_equal(r.cores_from, "/sys/fs/cgroup/kubepods/pod1/c1/cpu.max: 150000/100000 = 1.5 CPUs, rounded up");

  v2_tree("50000 100000\n", NULL); /* half a core is still one to size threads by */
  r = readit(4, 16 * GIB);
  assert_int_equal(r.cores, 1);
}

static void test_v2_nested_smallest(void **state) {
  (void)state;
  v2_tree("400000 100000\n", "3221225472\n");  /* the container: 4 CPUs, 3 GiB */
  put("/sys/fs/cgroup/kubepods/pod1/cpu.max", "250000 100000\n"); /* the pod: 2.5 */
  put("/sys/fs/cgroup/kubepods/pod1/memory.max", "max\n");
  put("/sys/fs/cgroup/kubepods/cpu.max", "max 100000\n");
  put("/sys/fs/cgroup/kubepods/memory.max", "2147483648\n"); /* the node's pods: 2 GiB */
  pw_sysres r = readit(8, 16 * GIB);
  assert_int_equal(r.cores, 3);
  assert_string_equal(r.cores_from, "/sys/fs/cgroup/kubepods/pod1/cpu.max: 250000/100000 = 2.5 CPUs, rounded up");
  assert_true(r.memory == 2 * GIB);
  assert_string_equal(r.memory_from, "/sys/fs/cgroup/kubepods/memory.max: 2.0 GiB");
  /* a different period compares by the ratio, not the quota */
  put("/sys/fs/cgroup/kubepods/cpu.max", "90000 50000\n"); /* 1.8 */
  r = readit(8, 16 * GIB);
  assert_int_equal(r.cores, 2);
  assert_string_equal(r.cores_from, "/sys/fs/cgroup/kubepods/cpu.max: 90000/50000 = 1.8 CPUs, rounded up");
}

static void test_affinity_below_quota(void **state) {
  (void)state;
  v2_tree("400000 100000\n", NULL);
  pw_sysres r = readit(2, 16 * GIB); /* taskset -c 0,1 inside a 4-CPU quota */
  assert_int_equal(r.cores, 2);
  assert_int_equal(r.quota_cores, 4);
  assert_string_equal(r.cores_from, "the affinity mask: 2 of 8 CPUs online");
  /* the whole machine */
  pw_sysres_src src = {.root = root, .cpus = 8, .online = 8, .phys = GIB};
  v2_tree("max 100000\n", NULL);
  assert_int_equal(pw_sysres_read(&src, &r), 0);
  assert_string_equal(r.cores_from, "8 CPUs online, all in the affinity mask");
}

static void test_memory_over_physical(void **state) {
  (void)state;
  v2_tree(NULL, "68719476736\n"); /* 64 GiB limit on a 16 GiB machine */
  pw_sysres r = readit(4, 16 * GIB);
  assert_true(r.memory == 16 * GIB);
  assert_true(r.mem_limit == 64 * GIB);
  assert_string_equal(r.memory_from, "physical memory: 16.0 GiB");
}

/* A hybrid host as Debian 11 and this sandbox have it: cpu and memory in
 * v1 hierarchies, an empty cgroup2 at /sys/fs/cgroup/unified. */
static void test_v1_hybrid(void **state) {
  (void)state;
  put("/proc/self/cgroup", "12:pids:/\n4:memory:/jobs/j7\n3:cpu,cpuacct:/jobs/j7/step0\n1:name=systemd:/\n0::/\n");
  put("/proc/self/mountinfo",
      "31 23 0:28 / /sys/fs/cgroup ro - tmpfs tmpfs ro,mode=755\n"
      "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:9 - cgroup cgroup rw,cpu,cpuacct\n"
      "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
      "40 31 0:37 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,xattr,name=systemd\n"
      "41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n");
  put("/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "-1\n");
  put("/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n");
  put("/sys/fs/cgroup/cpu,cpuacct/jobs/j7/step0/cpu.cfs_quota_us", "-1\n");
  put("/sys/fs/cgroup/cpu,cpuacct/jobs/j7/step0/cpu.cfs_period_us", "100000\n");
  put("/sys/fs/cgroup/cpu,cpuacct/jobs/j7/cpu.cfs_quota_us", "300000\n");
  put("/sys/fs/cgroup/cpu,cpuacct/jobs/j7/cpu.cfs_period_us", "100000\n");
  put("/sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n"); /* the root's "none" */
  put("/sys/fs/cgroup/memory/jobs/j7/memory.limit_in_bytes", "4294967296\n");
  put("/sys/fs/cgroup/unified/cgroup.procs", "");
  pw_sysres r = readit(8, 16 * GIB);
  assert_int_equal(r.cores, 3);
  assert_string_equal(r.cores_from, "/sys/fs/cgroup/cpu,cpuacct/jobs/j7/cpu.cfs_quota_us: 300000/100000 = 3 CPUs");
  assert_true(r.memory == 4 * GIB);
  assert_string_equal(r.memory_from, "/sys/fs/cgroup/memory/jobs/j7/memory.limit_in_bytes: 4.0 GiB");
  assert_string_equal(r.note, "");
}

/* A container without its own cgroup namespace: the hierarchy's
 * /docker/abc is mounted at /sys/fs/cgroup, and /proc/self/cgroup names
 * the full path; one with it: "0::/" and its cgroup at the top. */
static void test_container_views(void **state) {
  (void)state;
  put("/proc/self/cgroup", "0::/docker/abc\n");
  put("/proc/self/mountinfo", "30 22 0:26 /docker/abc /sys/fs/cgroup ro - cgroup2 cgroup2 rw\n");
  put("/sys/fs/cgroup/cpu.max", "200000 100000\n");
  put("/sys/fs/cgroup/memory.max", "1073741824\n");
  pw_sysres r = readit(8, 16 * GIB);
  assert_int_equal(r.cores, 2);
  assert_string_equal(r.cores_from, "/sys/fs/cgroup/cpu.max: 200000/100000 = 2 CPUs");
  assert_true(r.memory == GIB);

  put("/proc/self/cgroup", "0::/\n");
  put("/proc/self/mountinfo", "30 22 0:26 / /sys/fs/cgroup ro - cgroup2 cgroup2 rw\n");
  r = readit(8, 16 * GIB);
  assert_int_equal(r.cores, 2);
  assert_true(r.memory == GIB);

  /* a path outside the mount's root (another namespace's): only the top */
  put("/proc/self/cgroup", "0::/../other\n");
  r = readit(8, 16 * GIB);
  assert_int_equal(r.cores, 2);
}

/* mountinfo escapes a space in a mount point as \040. */
static void test_escaped_mount_point(void **state) {
  (void)state;
  put("/proc/self/cgroup", "0::/a\n");
  put("/proc/self/mountinfo", "30 22 0:26 / /my\\040cgroups rw - cgroup2 cgroup2 rw\n");
  put("/my cgroups/a/cpu.max", "100000 100000\n");
  pw_sysres r = readit(8, GIB);
  assert_int_equal(r.cores, 1);
  assert_string_equal(r.cores_from, "/my cgroups/a/cpu.max: 100000/100000 = 1 CPU");
}

static void test_malformed_ignored(void **state) {
  (void)state;
  v2_tree("lots 100000\n", "-5\n");
  put("/sys/fs/cgroup/kubepods/pod1/cpu.max", "0 100000\n");
  pw_sysres r = readit(4, 16 * GIB);
  assert_int_equal(r.cores, 4);
  assert_true(r.memory == 16 * GIB);
  assert_string_equal(r.note,
                      "/sys/fs/cgroup/kubepods/pod1/c1/cpu.max: malformed; /sys/fs/cgroup/kubepods/pod1/c1/memory.max: "
                      "malformed; /sys/fs/cgroup/kubepods/pod1/cpu.max: malformed");
  /* a directory where the file should be: unreadable, named */
  char p[PATH_MAX];
  snprintf(p, sizeof p, "%s/sys/fs/cgroup/kubepods/pod1/c1/cpu.max", root);
  assert_int_equal(unlink(p), 0);
  assert_int_equal(mkdir(p, 0755), 0);
  r = readit(4, 16 * GIB);
  assert_non_null(strstr(r.note, "/sys/fs/cgroup/kubepods/pod1/c1/cpu.max: Is a directory"));
  assert_int_equal(r.cores, 4);
}

/* No /proc here (another OS's layout, a bare chroot): the machine's
 * figures, and the note says why. */
static void test_no_proc(void **state) {
  (void)state;
  pw_sysres r = readit(3, 5 * GIB);
  assert_int_equal(r.cores, 3);
  assert_true(r.memory == 5 * GIB);
  assert_non_null(strstr(r.note, "/proc/self/cgroup: No such file or directory"));
}

/* A line longer than PW_SYSRES_LINE_MAX is skipped, not cut into a
 * different path; the lines after it are read. */
static void test_long_line_skipped(void **state) {
  (void)state;
  char *big = malloc(3 * PW_SYSRES_LINE_MAX);
  assert_non_null(big);
  int n = snprintf(big, 3 * PW_SYSRES_LINE_MAX, "1:cpu:/");
  memset(big + n, 'x', 2 * PW_SYSRES_LINE_MAX);
  snprintf(big + n + 2 * PW_SYSRES_LINE_MAX, PW_SYSRES_LINE_MAX, "\n0::/kubepods/pod1/c1\n");
  put("/proc/self/cgroup", big);
  free(big);
  put("/proc/self/mountinfo", MOUNTS_V2);
  put("/sys/fs/cgroup/kubepods/pod1/c1/cpu.max", "100000 100000\n");
  pw_sysres r = readit(4, GIB);
  assert_int_equal(r.cores, 1);
}

/* This process, read for real: within what the machine has. */
static void test_real(void **state) {
  (void)state;
  pw_sysres r;
  assert_int_equal(pw_sysres_read(NULL, &r), 0);
  assert_true(r.cores >= 1 && r.cores <= r.online);
  assert_true(r.memory > 0 && r.memory <= r.phys);
  assert_int_equal(pw_sysres_cores(), r.cores);
}

static void test_host_id(void **state) {
  (void)state;
  char id[PW_HOST_ID_MAX + 1], from[96];
  pw_err err = {0};
  assert_int_equal(pw_host_id(root, "node-7.example.org", "h", id, sizeof id, from, sizeof from, &err), 0);
  assert_string_equal(id, "node-7.example.org");
  assert_string_equal(from, "given");
  /* a Kubernetes node name may be 253 bytes: sent as a digest */
  char longname[PW_HOST_ID_GIVEN_MAX + 2];
  memset(longname, 'a', PW_HOST_ID_GIVEN_MAX);
  longname[PW_HOST_ID_GIVEN_MAX] = '\0';
  assert_int_equal(pw_host_id(root, longname, "h", id, sizeof id, from, sizeof from, &err), 0);
  assert_int_equal(strlen(id), strlen("sha256:") + 32);
  assert_memory_equal(id, "sha256:", 7);
  char id2[PW_HOST_ID_MAX + 1];
  longname[0] = 'b'; /* another name, another id */
  assert_int_equal(pw_host_id(root, longname, "h", id2, sizeof id2, from, sizeof from, &err), 0);
  assert_string_not_equal(id, id2);
  longname[PW_HOST_ID_GIVEN_MAX] = 'a';
  longname[PW_HOST_ID_GIVEN_MAX + 1] = '\0';
  assert_int_equal(pw_host_id(root, longname, "h", id, sizeof id, from, sizeof from, &err), PW_EINVAL);
  assert_int_equal(pw_host_id(root, "", "h", id, sizeof id, from, sizeof from, &err), PW_EINVAL);
  assert_int_equal(pw_host_id(root, "a b", "h", id, sizeof id, from, sizeof from, &err), PW_EINVAL);
  assert_string_equal(err.msg, "byte 1 (0x20) is not a letter, digit or one of . _ : @ -");
  assert_int_equal(pw_host_id(root, "a\nb", "h", id, sizeof id, from, sizeof from, &err), PW_EINVAL);
  assert_int_equal(pw_host_id(root, "n", "h", id, 8, from, sizeof from, &err), PW_EINVAL); /* too small a buffer */

  assert_int_equal(pw_host_id(root, NULL, "myhost", id, sizeof id, from, sizeof from, &err), 0);
  assert_string_equal(id, "myhost"); /* no machine-id in the fake tree */
  put("/etc/machine-id", "0123456789abcdef0123456789abcdef\n");
  assert_int_equal(pw_host_id(root, NULL, "myhost", id, sizeof id, from, sizeof from, &err), 0);
  assert_string_equal(id, "0123456789abcdef0123456789abcdef");
  assert_string_equal(from, "/etc/machine-id");
  put("/etc/machine-id", "\n"); /* empty, as an image built without one ships it */
  assert_int_equal(pw_host_id(root, NULL, "myhost", id, sizeof id, from, sizeof from, &err), 0);
  assert_string_equal(id, "myhost");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_v2_quota, setup, teardown),
      cmocka_unit_test_setup_teardown(test_v2_nested_smallest, setup, teardown),
      cmocka_unit_test_setup_teardown(test_affinity_below_quota, setup, teardown),
      cmocka_unit_test_setup_teardown(test_memory_over_physical, setup, teardown),
      cmocka_unit_test_setup_teardown(test_v1_hybrid, setup, teardown),
      cmocka_unit_test_setup_teardown(test_container_views, setup, teardown),
      cmocka_unit_test_setup_teardown(test_escaped_mount_point, setup, teardown),
      cmocka_unit_test_setup_teardown(test_malformed_ignored, setup, teardown),
      cmocka_unit_test_setup_teardown(test_no_proc, setup, teardown),
      cmocka_unit_test_setup_teardown(test_long_line_skipped, setup, teardown),
      cmocka_unit_test(test_real),
      cmocka_unit_test_setup_teardown(test_host_id, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
