//go:build faults

package faults

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// openFDs counts the open file descriptors of process pid (/proc/PID/fd).
func openFDs(t *testing.T, pid int) int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatalf("counting pid %d's file descriptors: %v", pid, err)
	}
	return len(ents)
}

// statusKB reads a "kB" field of /proc/PID/status: VmRSS (resident now)
// or VmHWM (the most it was ever resident).
func statusKB(t *testing.T, pid int, field string) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("reading pid %d's status: %v", pid, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || name != field {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		if err != nil {
			t.Fatalf("pid %d %s: %q: %v", pid, field, rest, err)
		}
		return kb
	}
	t.Fatalf("pid %d's status has no %s", pid, field)
	return 0
}

// needFDs fails the test unless this process may open n more files: the
// connection cases hold thousands of sockets at once.
func needFDs(t *testing.T, n int) {
	t.Helper()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Cur < uint64(n)+256 {
		t.Fatalf("RLIMIT_NOFILE is %d (hard %d); this case holds %d connections at once: raise it (ulimit -n)", lim.Cur, lim.Max, n)
	}
}
