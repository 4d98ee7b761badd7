"""gpu-check: how long the CUDA build took, from ninja's log."""
import sys

rows = [line.split("\t") for line in open(sys.argv[1]) if not line.startswith("#")]
start = min(int(r[0]) for r in rows)
end = max(int(r[1]) for r in rows)
cu = [r for r in rows if r[3].endswith(".cu.o")]
print("build: ninja compiled %d objects (%d CUDA) in %.0f s wall" % (len(rows), len(cu), (end - start) / 1000.0))
