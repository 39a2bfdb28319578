package testkit

import (
	"syscall"
	"time"
)

// CPUTime is this process's CPU time, user and system. Benchmarks report
// it per operation: unlike operations per second, it does not move when
// other processes share the cores.
func CPUTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
