package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRunWritesTableAndFiles runs the command on a short scenario and
// checks the table and every output file, and that a second run with the
// same seed writes identical bytes.
func TestRunWritesTableAndFiles(t *testing.T) {
	dirs := []string{t.TempDir(), t.TempDir()}
	var outs []string
	for _, dir := range dirs {
		var stdout, stderr bytes.Buffer
		args := []string{"-scenario", "zipf", "-strategies", "static,leased", "-duration", "20s", "-seed", "3", "-out", dir}
		if err := run(args, &stdout, &stderr); err != nil {
			t.Fatalf("run: %v (stderr %q)", err, stderr.String())
		}
		outs = append(outs, stdout.String())
	}
	if !strings.Contains(outs[0], "zipf") || !strings.Contains(outs[0], "leased") || outs[0] != outs[1] {
		t.Fatalf("tables differ or lack the run:\n%s\n%s", outs[0], outs[1])
	}
	for _, name := range []string{"results.csv", "instances.csv", "series.csv", "summary.svg", "fairness.svg", "zipf.svg", "instances-zipf.svg"} {
		a, err := os.ReadFile(filepath.Join(dirs[0], name))
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(dirs[1], name))
		if err != nil {
			t.Fatal(err)
		}
		if len(a) == 0 || !bytes.Equal(a, b) {
			t.Errorf("%s: empty or different between two runs with the same seed", name)
		}
	}
}

// TestRunRejectsBadFlags: unknown names are errors, not silent defaults.
func TestRunRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{{"-scenario", "nope"}, {"-strategies", "nope"}, {"-fallback", "nope"}} {
		var out bytes.Buffer
		if err := run(args, &out, &out); err == nil {
			t.Errorf("run(%v) = nil, want an error", args)
		}
	}
}
