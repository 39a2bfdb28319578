//go:build faults

package faults

import (
	"os"
	"runtime"
	"strconv"
	"testing"
)

// burnEnv, set to a number n, makes this test binary a CPU burner: n
// goroutines spinning forever instead of the tests (see TestMain).
const burnEnv = "FAULTS_BURN_GOROUTINES"

// burn spins n goroutines until the process is killed.
func burn(n string) {
	k, err := strconv.Atoi(n)
	if err != nil || k < 1 {
		os.Exit(2)
	}
	runtime.GOMAXPROCS(k)
	for range k - 1 {
		go spin()
	}
	spin()
}

//go:noinline
func spin() {
	for x := uint64(1); ; x = x*6364136223846793005 + 1442695040888963407 {
		if x == 0 { // never: keeps the loop's work observable
			runtime.Gosched()
		}
	}
}

// startBurner starts a separate process that keeps n cores busy until the
// test ends: CPU stress the gateways and the allocator must share the
// machine with. It is this test binary, re-run in burner mode, so CI needs
// no stress tool.
func startBurner(t *testing.T, n int) *proc {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return startProc(t, "cpu burner", exe, []string{burnEnv + "=" + strconv.Itoa(n)}, "-test.run=^$")
}
