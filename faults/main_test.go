//go:build faults

package faults

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// bin holds the paths of the binaries TestMain builds once for every test.
var bin struct {
	allocator string // cmd/allocator
	gateway   string // cmd/gateway-demo
}

// TestMain builds the binaries under test once, or, when this test binary
// was started as a CPU burner (see startBurner) or a flooder (see flood),
// burns CPU or holds connections instead of running tests.
func TestMain(m *testing.M) {
	if n := os.Getenv(burnEnv); n != "" {
		burn(n)
		return
	}
	if arg := os.Getenv(floodEnv); arg != "" {
		floodFrom(arg)
		return
	}
	dir, err := os.MkdirTemp("", "ration-faults-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "faults:", err)
		os.Exit(1)
	}
	bin.allocator = filepath.Join(dir, "allocator")
	bin.gateway = filepath.Join(dir, "gateway-demo")
	for out, pkg := range map[string]string{bin.allocator: "./cmd/allocator", bin.gateway: "./cmd/gateway-demo"} {
		// The package directory is faults/, so the module root is "..".
		cmd := exec.Command("go", "build", "-o", out, pkg)
		cmd.Dir = ".."
		if b, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "faults: go build %s: %v\n%s", pkg, err, b)
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
