package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
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
	for _, want := range []string{"| team | leased | 8 | 2× | key-0 | RPM 4000 |", "| team | leased | 8 | 2× | key-3 | RPM 1000 |", "| team | leased | 8 | 2× | team | RPM 6000 |"} {
		if !strings.Contains(out, want) {
			t.Errorf("the table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "| sim-key |") {
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

// TestRunSweeps: lists of fleet sizes and loads run every combination,
// one table row each with its N and load; -out writes every row into
// results.csv and each combination's files into its own directory; -check
// adds one checked row per leased run and, on a miss, returns errMissed.
func TestRunSweeps(t *testing.T) {
	dir := t.TempDir()
	var stdout, stderr bytes.Buffer
	args := []string{"-scenario", "uniform", "-strategies", "static,leased", "-instances", "2,3", "-overload", "0.5,3", "-duration", "5s", "-out", dir, "-markdown", "-check"}
	err := run(args, &stdout, &stderr)
	if err != nil && !errors.Is(err, errMissed) {
		t.Fatalf("run: %v (stderr %q)", err, stderr.String())
	}
	out := stdout.String()
	for _, want := range []string{"| uniform | static | 2 | 0.5× |", "| uniform | leased | 2 | 3× |", "| uniform | static | 3 | 0.5× |", "| uniform | leased | 3 | 3× |",
		"| scenario | strategy | N | load | waited |", "check: "} {
		if !strings.Contains(out, want) {
			t.Errorf("the output lacks %q:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "| uniform | leased |"); n != 8 {
		t.Errorf("%d leased rows, want 4 results and 4 checked:\n%s", n, out)
	}
	if strings.Contains(out, "MISS") != (err != nil) {
		t.Errorf("run returned %v, and the check table says:\n%s", err, out)
	}
	b, err := os.ReadFile(filepath.Join(dir, "results.csv"))
	if err != nil {
		t.Fatal(err)
	}
	if rows := strings.Count(string(b), "\n"); rows != 1+8 {
		t.Errorf("results.csv has %d lines, want a header and 8 rows", rows)
	}
	for _, sub := range []string{"n2-load0.5", "n2-load3", "n3-load0.5", "n3-load3"} {
		if _, err := os.Stat(filepath.Join(dir, sub, "uniform.svg")); err != nil {
			t.Error(err)
		}
	}
}

// TestRunRejectsBadFlags: unknown names are errors, not silent defaults.
func TestRunRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{{"-scenario", "nope"}, {"-strategies", "nope"}, {"-fallback", "nope"},
		{"-instances", "8,x"}, {"-instances", "0"}, {"-overload", "2,"}, {"-overload", "-1"}} {
		var out bytes.Buffer
		if err := run(args, &out, &out); err == nil {
			t.Errorf("run(%v) = nil, want an error", args)
		}
	}
}

// TestRunClientScenarios: a client alone does not depend on the load, so
// a sweep runs it once per fleet size, its load shown as "-"; the client
// beside other traffic runs at every load. -rpm keeps the per-day key's
// window: 48 a day over two hours admits its burst and a few more, not
// 48 a minute.
func TestRunClientScenarios(t *testing.T) {
	var stdout, stderr bytes.Buffer
	args := []string{"-scenario", "client,client-load", "-strategies", "leased", "-instances", "1,2", "-overload", "2,3", "-duration", "2m", "-markdown"}
	if err := run(args, &stdout, &stderr); err != nil {
		t.Fatalf("run: %v (stderr %q)", err, stderr.String())
	}
	out := stdout.String()
	if n, m := strings.Count(out, "| client | leased |"), strings.Count(out, "| client-load | leased |"); n != 2 || m != 4 {
		t.Errorf("%d client rows and %d client-load rows, want 2 and 4:\n%s", n, m, out)
	}
	for _, want := range []string{"| client | leased | 1 | - |", "| client-load | leased | 2 | 3× |", "| retried adm |"} {
		if !strings.Contains(out, want) {
			t.Errorf("the output lacks %q:\n%s", want, out)
		}
	}
	dir := t.TempDir()
	stdout.Reset()
	args = []string{"-scenario", "client-day", "-strategies", "sticky", "-rpm", "48", "-duration", "2h", "-out", dir}
	if err := run(args, &stdout, &stderr); err != nil {
		t.Fatalf("run: %v (stderr %q)", err, stderr.String())
	}
	b, err := os.ReadFile(filepath.Join(dir, "results.csv"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	head, row := strings.Split(lines[0], ","), strings.Split(lines[1], ",")
	i := slices.Index(head, "admitted")
	if n, err := strconv.Atoi(row[i]); err != nil || n < 48 || n > 56 {
		t.Errorf("client-day at 48 a day admitted %s in two hours, want 48 to 56", row[i])
	}
}
