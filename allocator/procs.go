package allocator

// ServerProcs returns the GOMAXPROCS a process serving a durable Ledger
// should run with when the runtime would otherwise use n Ps (the usable
// CPUs): n+1.
//
// A group commit ends in two fdatasyncs (bbolt syncs its pages, then its
// meta page), each 0.3–1 ms on a VM's disk. A goroutine in a blocking
// syscall keeps its P until the runtime's sysmon takes it back, and sysmon
// polls every 20 µs to 10 ms, backing off while it finds nothing to do; so
// with n Ps, one of them sits in the fsync for much of it while there is
// work queued and a core idle. With one spare P the other n keep the cores
// busy. Measured on 2 cores (docs/results.md, "## Allocator"): the durable
// allocator used 1.71–1.83 cores at GOMAXPROCS=2 and ~1.95 at 3, and its
// calls/s rose by 10–20%, while a bare echo server is at its best at 2.
// An idle spare P costs nothing; when all n+1 are busy, the kernel
// time-slices n+1 threads on n cores, which costs little next to an fsync.
func ServerProcs(n int) int {
	if n < 1 {
		n = 1
	}
	return n + 1
}
