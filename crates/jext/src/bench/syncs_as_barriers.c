/*
 * syncs_as_barriers.c: an LD_PRELOAD library that turns a program's fsync and fdatasync
 * on a jext mount into fbarrier and fdatabarrier (include/jext.h): BarrierFS Fig. 15's
 * "ordering" runs of SQLite, every sync ordering-only, with the program unchanged.
 *
 * `jext bench sqlite` builds it with gcc into its scratch directory and runs sqlite3 with
 * it on the systems that ask for it. Off jext the ioctl fails with ENOTTY and the real
 * call runs, so what is not on the mount stays durable as the program asked.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>

#include "jext.h"

/* The next definition of `name` after this library's (libc's). */
static int real_sync(const char *name, int fd)
{
	int (*call)(int) = (int (*)(int))dlsym(RTLD_NEXT, name);

	if (!call) {
		errno = ENOSYS;
		return -1;
	}
	return call(fd);
}

int fsync(int fd)
{
	if (jext_fbarrier(fd) == 0)
		return 0;
	return errno == ENOTTY ? real_sync("fsync", fd) : -1;
}

int fdatasync(int fd)
{
	if (jext_fdatabarrier(fd) == 0)
		return 0;
	return errno == ENOTTY ? real_sync("fdatasync", fd) : -1;
}
