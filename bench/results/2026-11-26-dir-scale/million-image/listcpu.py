import os, sys, time, resource
d = sys.argv[1]; pid = int(sys.argv[2]); reps = int(sys.argv[3])
tck = os.sysconf('SC_CLK_TCK')
def dcpu():
    f = open('/proc/%d/stat' % pid).read().rsplit(')', 1)[1].split()
    return (int(f[11]) + int(f[12])) / tck
for _ in range(reps):
    r0 = resource.getrusage(resource.RUSAGE_SELF); d0 = dcpu(); t = time.perf_counter()
    n = sum(1 for _ in os.scandir(d))
    wall = time.perf_counter() - t; r1 = resource.getrusage(resource.RUSAGE_SELF); d1 = dcpu()
    lister = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    print("%d wall %.0f ms, lister cpu %.0f ms, daemon cpu %.0f ms" % (n, wall*1e3, lister*1e3, (d1-d0)*1e3))
