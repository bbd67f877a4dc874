/*
 * jext.h: BarrierFS's ordering-only syncs on a jext mount.
 *
 *   jext_fbarrier(fd)      like fsync(fd), but returns once the file's data and metadata
 *                          are ordered before anything written after the call, not once
 *                          they are durable. A crash may lose them, but never keeps a later
 *                          write while losing them.
 *   jext_fdatabarrier(fd)  the same for what fdatasync(fd) covers.
 *
 * Both return 0 or -1 with errno set, as fsync does; on a file system that is not jext the
 * ioctl fails with ENOTTY, and a program may fall back to fsync/fdatasync then. jext keeps
 * the order with its journal: the file's data waits in the running journal transaction,
 * which commits when it is due (commit=, an fsync, sync), so a barrier costs no device
 * write and no flush; a later fsync of any file makes everything barrier'd before it
 * durable too.
 */
#ifndef JEXT_H
#define JEXT_H

#include <sys/ioctl.h>

#define JEXT_IOC_FBARRIER _IO('j', 0x40)
#define JEXT_IOC_FDATABARRIER _IO('j', 0x41)

static inline int jext_fbarrier(int fd)
{
	return ioctl(fd, JEXT_IOC_FBARRIER);
}

static inline int jext_fdatabarrier(int fd)
{
	return ioctl(fd, JEXT_IOC_FDATABARRIER);
}

#endif
