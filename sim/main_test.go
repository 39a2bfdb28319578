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
	for _, name := range []string{"results.csv", "budgets.csv", "instances.csv", "series.csv", "summary.svg", "fairness.svg", "zipf.svg", "instances-zipf.svg"} {
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

// TestRunShowsEveryBudget: a scenario that charges each request to
// several budgets adds a table with one row per budget, one budgets.csv
// row per budget and a per-budget plot; a one-key scenario's output has
// no per-budget table.
func TestRunShowsEveryBudget(t *testing.T) {
	dir := t.TempDir()
	var stdout, stderr bytes.Buffer
	args := []string{"-scenario", "zipf,team", "-strategies", "leased", "-duration", "10s", "-out", dir, "-markdown"}
	if err := run(args, &stdout, &stderr); err != nil {
		t.Fatalf("run: %v (stderr %q)", err, stderr.String())
	}
	out := stdout.String()
	for _, want := range []string{"| team | leased | key-0 | RPM 4000 |", "| team | leased | key-3 | RPM 1000 |", "| team | leased | team | RPM 6000 |"} {
		if !strings.Contains(out, want) {
			t.Errorf("the table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "| zipf | leased | sim-key |") {
		t.Errorf("a one-key scenario has a per-budget row:\n%s", out)
	}
	b, err := os.ReadFile(filepath.Join(dir, "budgets.csv"))
	if err != nil {
		t.Fatal(err)
	}
	if rows := strings.Count(string(b), "\n"); rows != 1+1+5 {
		t.Errorf("budgets.csv has %d lines, want a header, zipf's key and team's 5 budgets:\n%s", rows, b)
	}
	if _, err := os.Stat(filepath.Join(dir, "budgets-team.svg")); err != nil {
		t.Error(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "budgets-zipf.svg")); err == nil {
		t.Error("a per-budget plot for a one-key scenario")
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
