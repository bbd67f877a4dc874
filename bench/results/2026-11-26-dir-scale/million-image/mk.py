import os, sys
d = sys.argv[1]; n = int(sys.argv[2])
os.makedirs(d, exist_ok=True)
for i in range(n):
    os.close(os.open(os.path.join(d, "f%07d" % i), os.O_CREAT | os.O_WRONLY, 0o644))
